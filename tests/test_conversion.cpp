// Weight conversion: ops, routing, the rules registry, loading reports, save round trips and the
// fused-QKV plugin against the Llama reference.
#include "test_prelude.h"
#include "test_util.h"

#include <unistd.h>
#include <fstream>

#include "torchpatch/checkpoint/load.h"
#include "torchpatch/error.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/patching/scope.h"
#include "torchpatch/plugin_host.h"

using namespace torchpatch;
using namespace torchpatch::checkpoint;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

fs::path llama_dir() { return testutil::data_dir() / "llama_basic"; }

// A fresh directory for this process, removed when the process exits (each test runs in its own).
fs::path temp_dir(const std::string& name) {
  struct Made {
    std::vector<fs::path> dirs;
    ~Made() {
      for (const auto& dir : dirs) {
        std::error_code ec;
        fs::remove_all(dir, ec);
      }
    }
  };
  static Made made;
  const auto dir = fs::temp_directory_path() / ("torchpatch-conv-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  made.dirs.push_back(dir);
  return dir;
}

// The bundled FusedQKVAttention class, loaded once per process (plugins are never loaded twice).
const ModuleClass& fused_qkv() {
  static const ModuleClass cls = [] {
    static PluginHost host;
    host.load_file(fs::path(TORCHPATCH_BUNDLED_PLUGIN_DIR) / "fused_qkv_attention.so", PluginMode::Catalogue);
    auto found = host.find_class("FusedQKVAttention");
    REQUIRE(found);
    return *found;
  }();
  return cls;
}

PatchMapping fused_mapping() { return PatchMapping({{"LlamaAttention", fused_qkv()}}); }

// Every tensor of two checkpoints, compared bit for bit.
void require_same_tensors(const Checkpoint& a, const Checkpoint& b) {
  REQUIRE(a.keys() == b.keys());
  for (const auto& key : a.keys()) {
    INFO(key);
    const auto x = a.tensor(key), y = b.tensor(key);
    REQUIRE(x.scalar_type() == y.scalar_type());
    REQUIRE(x.sizes() == y.sizes());
    REQUIRE(std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0);
  }
}

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

// A copy of llama_basic's config and weights, with `edit` applied to the tensors.
fs::path edited_llama(const std::string& name,
                      const std::function<void(std::vector<std::pair<std::string, at::Tensor>>&)>& edit) {
  const auto dir = temp_dir(name);
  fs::copy_file(llama_dir() / "config.json", dir / "config.json");
  auto ckpt = Checkpoint::open(llama_dir());
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& key : ckpt.keys()) tensors.emplace_back(key, ckpt.tensor(key).clone());
  edit(tensors);
  save_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

}  // namespace

TEST_CASE("natural key order puts expert 10 after expert 9", "[conversion]") {
  std::vector<std::string> keys{"experts.10.w", "experts.9.w", "experts.1.w", "experts.2.b", "a.b"};
  std::sort(keys.begin(), keys.end(), natural_key_less);
  CHECK(keys == std::vector<std::string>{"a.b", "experts.1.w", "experts.2.b", "experts.9.w", "experts.10.w"});
}

TEST_CASE("ops and their reverses", "[conversion]") {
  const auto a = at::arange(6, at::kFloat).view({2, 3}), b = at::arange(3, at::kFloat).view({1, 3});
  auto cat = Concatenate(0, {2, 1})->convert({{"a", {a}}, {"b", {b}}}, {"a", "b"}, {"ab"});
  REQUIRE(cat.size() == 1);
  CHECK(cat[0].first == "ab");
  CHECK(cat[0].second[0].sizes() == at::IntArrayRef{3, 3});
  auto back = Concatenate(0, {2, 1})->reverse()->convert(cat, {"ab"}, {"a", "b"});
  CHECK(at::equal(back[0].second[0], a));
  CHECK(at::equal(back[1].second[0], b));
  CHECK(Concatenate(0, {2, 1})->reverse()->name() == "Chunk(dim=0, sizes=[2, 1])");

  auto stacked = MergeModulelist(0)->convert({{"e.*.w", {a, a + 1, a + 2}}}, {"e.*.w"}, {"e.w"});
  CHECK(stacked[0].second[0].sizes() == at::IntArrayRef{3, 2, 3});
  auto split = MergeModulelist(0)->reverse()->convert(stacked, {"e.w"}, {"e.*.w"});
  REQUIRE(split[0].second.size() == 3);
  CHECK(at::equal(split[0].second[2], a + 2));

  auto t = Transpose(0, 1)->convert({{"x", {a}}}, {"x"}, {"y"});
  CHECK(at::equal(Transpose(0, 1)->reverse()->convert(t, {"y"}, {"x"})[0].second[0], a));

  REQUIRE_THROWS_WITH(Concatenate(1)->convert({{"a", {a}}, {"b", {at::ones({5})}}}, {"a", "b"}, {"ab"}),
                      Contains("cannot be concatenated"));
  REQUIRE_THROWS_WITH(Concatenate(0, {2, 2})->convert({{"a", {a}}, {"b", {b}}}, {"a", "b"}, {"ab"}),
                      Contains("expected parts of sizes [2, 2] along dim 0, got shapes [2, 3], [1, 3]"));
  REQUIRE_THROWS_WITH(Chunk(0)->convert({{"x", {at::ones({3, 2})}}}, {"x"}, {"a", "b"}),
                      Contains("does not split into 2 equal parts"));
}

TEST_CASE("routing: renamings chain, the first converter wins, .*. and scopes", "[conversion]") {
  ConversionPlan plan({{"", {WeightRenaming{"LayerNorm.gamma", "LayerNorm.weight"},
                             WeightRenaming{"^old\\.(\\w+)", "new.\\1"},
                             WeightConverter{{"mlp.experts.*.gate_proj.weight", "mlp.experts.*.up_proj.weight"},
                                             {"mlp.experts.gate_up_proj"},
                                             {MergeModulelist(0), Concatenate(1)}},
                             WeightConverter{{"mlp.experts.*.gate_proj.weight"}, {"never"}, {MergeModulelist(0)}}}},
                       {"layers.0.attn", {WeightConverter{{"q.weight", "k.weight"}, {"qk.weight"}, {Concatenate(0)}}}}});
  CHECK(plan.route("enc.LayerNorm.gamma").key() == "enc.LayerNorm.weight");
  CHECK(plan.route("old.thing.x").key() == "new.thing.x");
  auto r = plan.route("model.layers.3.mlp.experts.12.up_proj.weight");
  REQUIRE(r.converter != nullptr);
  CHECK(r.key() == "model.layers.3.mlp.experts.gate_up_proj");
  CHECK(r.source_index == 1);
  CHECK(plan.route("model.layers.3.mlp.expertsX12.up_proj.weight").converter == nullptr);  // ".*." needs the dots
  CHECK(plan.route("layers.0.attn.k.weight").key() == "layers.0.attn.qk.weight");
  CHECK(plan.route("layers.1.attn.k.weight").converter == nullptr);  // out of scope
}

TEST_CASE("the conversion registry refuses a duplicate without overwrite", "[conversion]") {
  register_checkpoint_conversion_mapping("test_type", ConversionRules{WeightRenaming{"a", "b"}});
  REQUIRE_THROWS_WITH(register_checkpoint_conversion_mapping("test_type", ConversionRules{}),
                      "Conversion mapping for 'test_type' already exists (registered by builtin). Pass "
                      "overwrite=true to replace it.");
  register_checkpoint_conversion_mapping("test_type", ConversionRules{}, /*overwrite=*/true);
  CHECK(get_checkpoint_conversion_mapping("test_type", ModelConfig{})->empty());
  unregister_checkpoint_conversion_mapping("test_type");
  CHECK(!get_checkpoint_conversion_mapping("test_type", ModelConfig{}));
}

TEST_CASE("load, save, load is bit-exact for llama_basic", "[conversion][roundtrip]") {
  auto model = from_pretrained(llama_dir());
  const auto out = temp_dir("roundtrip");
  save_pretrained(*model, out);
  require_same_tensors(Checkpoint::open(llama_dir()), Checkpoint::open(out));
  CHECK(ModelConfig::from_file(out).decoder.num_key_value_heads == 2);
}

TEST_CASE("with FusedQKVAttention: reference logits, and save writes q/k/v back bit-exactly", "[conversion][fused]") {
  ApplyPatches scope(fused_mapping());
  LoadReport report;
  auto model = from_pretrained(llama_dir(), {}, &report);
  REQUIRE(report.clean());
  REQUIRE(report.conversions.size() == 1);
  CHECK_THAT(report.conversions[0], Contains("Concatenate(dim=0, sizes=[64, 32, 32])"));
  std::vector<std::string> keys;
  for (const auto& p : model->named_parameters()) keys.push_back(p.key());
  CHECK(std::count(keys.begin(), keys.end(), "model.layers.0.self_attn.qkv_proj.weight") == 1);
  CHECK(std::count(keys.begin(), keys.end(), "model.layers.0.self_attn.q_proj.weight") == 0);

  auto ref = SafetensorsFile::open(llama_dir() / "reference.safetensors");
  ModelInputs in;
  in.input_ids = ref->tensor("input_ids");
  in.attention_mask = ref->tensor("attention_mask");
  in.position_ids = ref->tensor("position_ids");
  at::NoGradGuard no_grad;
  CHECK(testutil::close("fused-qkv logits", model->forward(in).logits, ref->tensor("logits"), in.attention_mask));

  const auto out = temp_dir("fused");
  save_pretrained(*model, out);
  require_same_tensors(Checkpoint::open(llama_dir()), Checkpoint::open(out));
}

TEST_CASE("sharded checkpoints: save in shards, load, save again bit-exactly", "[conversion][shards]") {
  ApplyPatches scope(fused_mapping());
  auto model = from_pretrained(llama_dir());
  const auto sharded = temp_dir("sharded");
  save_pretrained(*model, sharded, SaveOptions{100 * 1000});
  CHECK(fs::exists(sharded / "model.safetensors.index.json"));
  CHECK(!fs::exists(sharded / "model.safetensors"));
  const auto ckpt = Checkpoint::open(sharded);
  CHECK(ckpt.files().size() > 3);
  require_same_tensors(Checkpoint::open(llama_dir()), ckpt);
  auto again = from_pretrained(sharded);
  const auto single = temp_dir("unsharded");
  save_pretrained(*again, single);
  require_same_tensors(Checkpoint::open(llama_dir()), Checkpoint::open(single));
}

TEST_CASE("conversion errors: incomplete q/k/v and shapes that cannot be concatenated", "[conversion][errors]") {
  ApplyPatches scope(fused_mapping());
  const auto no_v = edited_llama("no-v", [](auto& tensors) {
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                                 [](const auto& t) { return t.first == "model.layers.1.self_attn.v_proj.weight"; }),
                  tensors.end());
  });
  REQUIRE_THROWS_WITH(from_pretrained(no_v),
                      Contains("conversion for 'model.layers.1.self_attn.qkv_proj.weight' failed") &&
                          Contains("incomplete sources: nothing matches 'v_proj.weight'") &&
                          Contains("model.layers.1.self_attn.k_proj.weight"));
  const auto bad_k = edited_llama("bad-k", [](auto& tensors) {
    for (auto& [name, t] : tensors) {
      if (name == "model.layers.2.self_attn.k_proj.weight") t = at::zeros({32, 63});
    }
  });
  REQUIRE_THROWS_WITH(from_pretrained(bad_k), Contains("conversion for 'model.layers.2.self_attn.qkv_proj.weight'") &&
                                                  Contains("[64, 64], [32, 63], [32, 64]"));
}

TEST_CASE("the loading report collects every problem; non-strict loading says what it left", "[conversion][report]") {
  const auto dir = edited_llama("report", [](auto& tensors) {
    for (auto& [name, t] : tensors) {
      if (name == "model.norm.weight") t = at::ones({65});
    }
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                                 [](const auto& t) { return t.first == "model.layers.0.mlp.up_proj.weight"; }),
                  tensors.end());
    tensors.emplace_back("model.extra.weight", at::ones({2}));
  });
  try {
    from_pretrained(dir);
    FAIL("strict loading should throw");
  } catch (const CheckpointError& e) {
    const std::string m = e.what();
    CHECK_THAT(m, Contains("missing tensor 'model.layers.0.mlp.up_proj.weight'"));
    CHECK_THAT(m, Contains("unexpected tensor 'model.extra.weight'"));
    CHECK_THAT(m, Contains("tensor 'model.norm.weight' has shape [65] but the model expects [64]"));
  }
  LoadReport report;
  PretrainedOptions lenient;
  lenient.strict = false;
  auto model = from_pretrained(dir, lenient, &report);
  CHECK(report.missing == std::vector<std::string>{"model.layers.0.mlp.up_proj.weight"});
  CHECK(report.unexpected == std::vector<std::string>{"model.extra.weight"});
  REQUIRE(report.mismatched.size() == 1);
  CHECK_THAT(report.describe("x"), Contains("(left initialised)"));
}

TEST_CASE("checkpoint index errors name the index and the shard", "[conversion][shards][errors]") {
  const auto dir = temp_dir("index");
  fs::copy_file(llama_dir() / "config.json", dir / "config.json");
  write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}})");
  REQUIRE_THROWS_WITH(from_pretrained(dir), Contains("model.safetensors.index.json: names shard "
                                                     "'model-00002-of-00002.safetensors' (for tensor "
                                                     "'model.norm.weight'), which does not exist"));
  write_text(dir / "model.safetensors.index.json", "{not json");
  REQUIRE_THROWS_WITH(from_pretrained(dir), Contains("model.safetensors.index.json: not valid JSON"));
  write_text(dir / "model.safetensors.index.json", R"({"metadata": {}})");
  REQUIRE_THROWS_WITH(from_pretrained(dir), Contains("no 'weight_map' object"));
  fs::copy_file(llama_dir() / "model.safetensors", dir / "shard.safetensors");
  write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"model.nope": "shard.safetensors"}})");
  REQUIRE_THROWS_WITH(from_pretrained(dir), Contains("says tensor 'model.nope' is in"));
}

TEST_CASE("loading into a requested dtype", "[conversion][dtype]") {
  PretrainedOptions options;
  options.dtype = at::kBFloat16;
  auto model = from_pretrained(llama_dir(), options);
  for (const auto& p : model->named_parameters()) CHECK(p.value().scalar_type() == at::kBFloat16);
  at::NoGradGuard no_grad;
  ModelInputs in;
  in.input_ids = at::tensor({1, 2, 3}, at::kLong).unsqueeze(0);
  CHECK(model->forward(in).logits.scalar_type() == at::kBFloat16);
}

TEST_CASE("parameters loaded as views of the file are copy-on-write: writing never touches the file", "[conversion]") {
  const auto dir = edited_llama("cow", [](auto&) {});
  auto model = from_pretrained(dir);
  at::Tensor norm;
  for (const auto& p : model->named_parameters()) {
    if (p.key() == "model.norm.weight") norm = p.value();
  }
  REQUIRE(norm.defined());
  const auto before = Checkpoint::open(dir).tensor("model.norm.weight").clone();
  {
    at::NoGradGuard no_grad;
    norm.add_(1.0);
  }
  CHECK(at::equal(Checkpoint::open(dir).tensor("model.norm.weight"), before));
  CHECK(at::equal(norm, before + 1.0));
}

TEST_CASE("op dimensions: negative ones count from the end, missing ones are clear errors", "[conversion]") {
  const auto a = at::ones({2, 3}), b = at::zeros({2, 1});
  auto cat = Concatenate(-1)->convert({{"a", {a}}, {"b", {b}}}, {"a", "b"}, {"ab"});
  CHECK(cat[0].second[0].sizes() == at::IntArrayRef{2, 4});
  REQUIRE_THROWS_WITH(MergeModulelist(5)->convert({{"e.*.w", {a, a}}}, {"e.*.w"}, {"e.w"}),
                      Contains("MergeModulelist(dim=5): dimension 5 does not exist in a tensor of rank 3"));
  REQUIRE_THROWS_WITH(Transpose(0, 2)->convert({{"x", {a}}}, {"x"}, {"y"}),
                      Contains("dimension 2 does not exist in a tensor of rank 2"));
}

TEST_CASE("old checkpoints' rotary tables are ignored, not unexpected", "[conversion]") {
  const auto dir = edited_llama("inv-freq", [](auto& tensors) {
    tensors.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", at::ones({8}));
  });
  LoadReport report;
  from_pretrained(dir, {}, &report);
  CHECK(report.clean());
}

TEST_CASE("tied embeddings load from whichever name of the pair the checkpoint holds", "[conversion]") {
  const auto dir = edited_llama("tied-lm-head", [](auto& tensors) {
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                                 [](const auto& t) { return t.first == "model.embed_tokens.weight"; }),
                  tensors.end());
  });
  auto config = ModelConfig::from_file(dir).raw;
  config["tie_word_embeddings"] = true;
  std::ofstream(dir / "config.json") << config.dump();
  LoadReport report;
  auto model = from_pretrained(dir, {}, &report);
  CHECK(report.clean());
  const auto lm_head = Checkpoint::open(llama_dir()).tensor("lm_head.weight");
  for (const auto& p : model->named_parameters()) {
    if (p.key() == "model.embed_tokens.weight") CHECK(at::equal(p.value(), lm_head));
  }
}
