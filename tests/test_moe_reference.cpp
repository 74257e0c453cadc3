// Qwen2-MoE and Qwen3-MoE against the Python original: tests/data/qwen2_moe_basic and qwen3_moe_basic
// (see their manifest.json): logits, hidden states, router logits, chosen experts (exactly) and
// routing weights per layer, for the padded batch, each row, and the cached decoding steps; greedy
// generated ids exactly. With both experts implementations.
#include <mutex>
#include <set>
#include <thread>

#include "test_prelude.h"
#include "test_util.h"

#include <torch/csrc/api/include/torch/version.h>

#include "torchpatch/generation/generate.h"
#include "torchpatch/error.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/nn/moe.h"
#include "torchpatch/models/qwen2_moe.h"
#include "torchpatch/models/qwen3_moe.h"
#include "torchpatch/nn/rotary.h"
#include "torchpatch/patching/build.h"
#include "torchpatch/patching/outputs.h"
#include "torchpatch/patching/registry.h"
#include "torchpatch/plugin_host.h"

using namespace torchpatch;
using Catch::Matchers::Contains;

namespace {

struct Case {
  std::string name;
  std::filesystem::path dir;
  std::shared_ptr<checkpoint::SafetensorsFile> ref;
  explicit Case(const std::string& case_name)
      : name(case_name),
        dir(testutil::data_dir() / case_name),
        ref(checkpoint::SafetensorsFile::open(dir / "reference.safetensors")) {}
  at::Tensor get(const std::string& tensor) const { return ref->tensor(tensor); }
};

// The model of a case with the experts run by `implementation`.
std::shared_ptr<PretrainedModel> load(const Case& c, const std::string& implementation) {
  auto json = ModelConfig::from_file(c.dir).raw;
  json["experts_implementation"] = implementation;
  std::shared_ptr<PretrainedModel> model;
  {
    nn::SkipInit skip;
    model = from_config(ModelConfig::from_json(json));
  }
  const auto report = checkpoint::load_weights(*model, checkpoint::Checkpoint::open(c.dir), {});
  REQUIRE(report.clean());
  return model;
}

// Recorders for what each sparse layer chose, beside the built-in router_logits.
void register_routing_recorders(const std::string& model_class, const std::string& router) {
  register_output_recorder(model_class, "routing_weights", {router, 1, ""});
  register_output_recorder(model_class, "selected_experts", {router, 2, ""});
}

const std::vector<std::string> kRouting{"router_logits", "routing_weights", "selected_experts"};

// Router outputs of one forward against `prefix` + "router_logits_layer{i}" etc.
void check_routing(const ModelOutput& out, const Case& c, const std::string& prefix, const at::Tensor& row_mask) {
  for (size_t layer = 0; layer < 2; ++layer) {
    const auto suffix = "_layer" + std::to_string(layer);
    REQUIRE(out.captured.at("router_logits").size() == 2);
    CHECK(testutil::close(prefix + "router_logits" + suffix, out.captured.at("router_logits")[layer],
                          c.get(prefix + "router_logits" + suffix), row_mask));
    CHECK(testutil::close(prefix + "routing_weights" + suffix, out.captured.at("routing_weights")[layer],
                          c.get(prefix + "routing_weights" + suffix), row_mask, 1e-5, 1e-4));
    auto chosen = out.captured.at("selected_experts")[layer];
    auto expected = c.get(prefix + "selected_experts" + suffix);
    if (row_mask.defined()) {
      const auto keep = row_mask.to(at::kBool).unsqueeze(-1);
      chosen = chosen.masked_fill(keep.logical_not(), -1);
      expected = expected.masked_fill(keep.logical_not(), -1);
    }
    INFO(c.name << " " << prefix << "selected_experts" << suffix);
    CHECK(at::equal(chosen, expected));
  }
}

void check_case(const std::string& case_name, const std::string& model_class, const std::string& router,
                const std::string& implementation) {
  Case c(case_name);
  register_routing_recorders(model_class, router);
  auto model = load(c, implementation);
  REQUIRE(model->class_name() == model_class);
  at::NoGradGuard no_grad;

  // Padded batch.
  ModelInputs in;
  in.input_ids = c.get("input_ids");
  in.attention_mask = c.get("attention_mask");
  in.position_ids = c.get("position_ids");
  in.output_hidden_states = true;
  in.outputs = kRouting;
  const auto out = model->forward(in);
  const auto label = case_name + " (" + implementation + ") ";
  CHECK(testutil::close(label + "logits", out.logits, c.get("logits"), in.attention_mask));
  CHECK(testutil::close(label + "hidden_states", at::stack(out.hidden_states), c.get("hidden_states"),
                        in.attention_mask.unsqueeze(0)));
  check_routing(out, c, "", in.attention_mask.reshape({-1}));

  // Each row alone.
  for (int row = 0; row < 2; ++row) {
    const auto prefix = "row" + std::to_string(row) + "_";
    ModelInputs alone;
    alone.input_ids = c.get(prefix + "input_ids");
    alone.outputs = kRouting;
    const auto row_out = model->forward(alone);
    CHECK(testutil::close(label + prefix + "logits", row_out.logits, c.get(prefix + "logits")));
    check_routing(row_out, c, prefix, {});
  }

  // Greedy generation, with the experts chosen at each cached decoding step.
  GenerationConfig greedy;
  greedy.max_new_tokens = 8;
  greedy.output_logits = true;
  greedy.outputs = {"selected_experts", "routing_weights"};
  const auto generated = generate(*model, c.get("input_ids"), c.get("attention_mask"), greedy);
  CHECK(at::equal(generated.sequences, c.get("generated_ids")));
  CHECK(testutil::close(label + "generated_logits", at::stack(generated.logits), c.get("generated_logits")));
  REQUIRE(generated.captured.size() == 8);
  for (int layer = 0; layer < 2; ++layer) {
    std::vector<at::Tensor> chosen, weights;
    for (int step = 1; step < 8; ++step) {
      chosen.push_back(generated.captured[step].at("selected_experts")[layer]);  // [B, K] (one token per row)
      weights.push_back(generated.captured[step].at("routing_weights")[layer]);
    }
    const auto suffix = "_layer" + std::to_string(layer);
    INFO(label << "decode_selected_experts" << suffix);
    CHECK(at::equal(at::stack(chosen), c.get("decode_selected_experts" + suffix)));
    CHECK(testutil::close(label + "decode_routing_weights" + suffix, at::stack(weights),
                          c.get("decode_routing_weights" + suffix), {}, 1e-5, 1e-4));
  }
  for (int row = 0; row < 2; ++row) {
    const auto prefix = "row" + std::to_string(row) + "_";
    greedy.outputs.clear();
    const auto alone = generate(*model, c.get(prefix + "input_ids"), {}, greedy);
    INFO(label << prefix << "generated_ids");
    CHECK(at::equal(alone.sequences, c.get(prefix + "generated_ids")));
    CHECK(testutil::close(label + prefix + "generated_logits", at::stack(alone.logits),
                          c.get(prefix + "generated_logits")));
  }
}

}  // namespace

TEST_CASE("qwen2_moe_basic matches the reference, grouped experts", "[moe][qwen2_moe][reference]") {
  check_case("qwen2_moe_basic", "Qwen2MoeForCausalLM", "Qwen2MoeTopKRouter", "grouped");
}

TEST_CASE("qwen2_moe_basic matches the reference, eager experts", "[moe][qwen2_moe][reference]") {
  check_case("qwen2_moe_basic", "Qwen2MoeForCausalLM", "Qwen2MoeTopKRouter", "eager");
}

TEST_CASE("qwen3_moe_basic matches the reference, grouped experts", "[moe][qwen3_moe][reference]") {
  check_case("qwen3_moe_basic", "Qwen3MoeForCausalLM", "Qwen3MoeTopKRouter", "grouped");
}

TEST_CASE("qwen3_moe_basic matches the reference, eager experts", "[moe][qwen3_moe][reference]") {
  check_case("qwen3_moe_basic", "Qwen3MoeForCausalLM", "Qwen3MoeTopKRouter", "eager");
}

TEST_CASE("MoE configs, classes, keys and rope", "[moe]") {
  Case c("qwen2_moe_basic");
  const auto config = ModelConfig::from_file(c.dir);
  CHECK(config.decoder.moe.num_experts == 8);
  CHECK(config.decoder.moe.shared_expert_intermediate_size == 64);
  CHECK(config.decoder.moe.is_sparse_layer(0));
  auto model = load(c, "grouped");
  const auto params = model->named_parameters();
  CHECK(params["model.layers.0.mlp.experts.gate_up_proj"].sizes() == at::IntArrayRef({8, 64, 64}));
  CHECK(params["model.layers.0.mlp.experts.down_proj"].sizes() == at::IntArrayRef({8, 64, 32}));
  CHECK(params["model.layers.0.mlp.gate.weight"].sizes() == at::IntArrayRef({8, 64}));
  CHECK(params["model.layers.0.mlp.shared_expert_gate.weight"].sizes() == at::IntArrayRef({1, 64}));
  std::map<std::string, int> classes;
  for (const auto& point : model->patch_points()) ++classes[point.module->patch_record().class_name];
  CHECK(classes["Qwen2MoeSparseMoeBlock"] == 2);
  CHECK(classes["Qwen2MoeTopKRouter"] == 2);
  CHECK(classes["Qwen2MoeExperts"] == 2);
  CHECK(classes["Qwen2MoeMLP"] == 2);  // the shared experts
  CHECK(testutil::close("qwen2_moe rope_inv_freq", nn::RotaryEmbedding(config.decoder).inv_freq(),
                        c.get("rope_inv_freq"), {}, 1e-7, 1e-6));

  Case c3("qwen3_moe_basic");
  const auto config3 = ModelConfig::from_file(c3.dir);
  CHECK(config3.decoder.head_dim == 32);
  CHECK(config3.decoder.qk_norm);
  auto model3 = load(c3, "grouped");
  CHECK(model3->named_parameters()["model.layers.1.self_attn.q_norm.weight"].sizes() == at::IntArrayRef({32}));
  CHECK_FALSE(model3->named_parameters().contains("model.layers.0.mlp.shared_expert_gate.weight"));

  // mlp_only_layers and decoder_sparse_step choose dense layers.
  auto json = config.raw;
  json["mlp_only_layers"] = {1};
  auto mixed = construct_model(ModelConfig::from_json(json));
  CHECK(mixed->named_parameters().contains("model.layers.1.mlp.gate_proj.weight"));
  CHECK(mixed->named_parameters().contains("model.layers.0.mlp.gate.weight"));
  json["mlp_only_layers"] = {7};
  REQUIRE_THROWS_WITH(ModelConfig::from_json(json), Contains("mlp_only_layers holds 7, not a layer index below 2"));
  json["mlp_only_layers"] = nlohmann::json::array();
  json["num_experts_per_tok"] = 9;
  REQUIRE_THROWS_WITH(ModelConfig::from_json(json), Contains("num_experts_per_tok 9 is more than num_experts 8"));
  json["num_experts_per_tok"] = 2;
  json["experts_implementation"] = "fast";
  REQUIRE_THROWS_WITH(ModelConfig::from_json(json), Contains("experts_implementation 'fast' is not one of grouped, eager"));
}

TEST_CASE("output capture: unknown names are clear errors, and recorders can be removed", "[moe][outputs]") {
  auto model = construct_model(ModelConfig::from_file(testutil::data_dir() / "qwen2_moe_basic"));
  ModelInputs in;
  in.input_ids = at::ones({1, 3}, at::kLong);
  in.outputs = {"expert_usage"};
  REQUIRE_THROWS_WITH(model->forward(in), Contains("output 'expert_usage': Qwen2MoeForCausalLM has no recorder by that name"));
  register_output_recorder("Qwen2MoeForCausalLM", "expert_usage", {"Qwen2MoeExperts", 0, "layers.1."});
  const auto out = model->forward(in);
  REQUIRE(out.captured.at("expert_usage").size() == 1);  // layer 1 only
  CHECK(out.captured.at("expert_usage")[0].sizes() == at::IntArrayRef({3, 64}));
  CHECK(unregister_output_recorder("Qwen2MoeForCausalLM", "expert_usage"));
  REQUIRE_THROWS_AS(model->forward(in), InputError);
  REQUIRE_THROWS_WITH(register_output_recorder("Qwen2MoeForCausalLM", "x", {"", 0, ""}), Contains("needs a name, a target"));
}

TEST_CASE("output capture: attentions, and recorders follow a replacement", "[outputs]") {
  // attentions: one [B, nH, Q, KV] per layer, rows summing to 1, nothing on masked keys.
  auto llama = from_pretrained(testutil::data_dir() / "llama_basic");
  const auto ref = checkpoint::SafetensorsFile::open(testutil::data_dir() / "llama_basic" / "reference.safetensors");
  ModelInputs in;
  in.input_ids = ref->tensor("input_ids");
  in.attention_mask = ref->tensor("attention_mask");
  in.position_ids = ref->tensor("position_ids");
  in.outputs = {"attentions"};
  at::NoGradGuard no_grad;
  const auto out = llama->forward(in);
  const auto& attentions = out.captured.at("attentions");
  REQUIRE(attentions.size() == 3);
  CHECK(attentions[0].sizes() == at::IntArrayRef({2, 4, 12, 12}));
  const auto real_rows = in.attention_mask.view({2, 1, 12}).to(at::kBool);
  CHECK(testutil::close("attention rows sum to 1", attentions[1].sum(-1).masked_select(real_rows),
                        at::ones({real_rows.sum().item<int64_t>() * 4}), {}, 1e-5, 0));
  // Row 1 is left-padded by 4: its real queries (4..11) put nothing on the pad keys (0..3).
  CHECK(attentions[2].select(0, 1).narrow(1, 4, 8).narrow(-1, 0, 4).abs().max().item<double>() == 0);
  // The same model with its attention patched still records (matching is by patch point).
  PluginHost host;
  host.load_directory(TORCHPATCH_BUNDLED_PLUGIN_DIR, PluginMode::Catalogue);
  ScopedPatchMapping patch({{"LlamaAttention", *host.find_class("FusedQKVAttention")}});
  auto fused = from_pretrained(testutil::data_dir() / "llama_basic");
  const auto fused_out = fused->forward(in);
  CHECK(testutil::close("attentions through FusedQKVAttention", fused_out.captured.at("attentions")[2], attentions[2],
                        {}, 1e-5, 1e-4));
}

namespace {
// Eight experts of width 32 over a hidden size of 64, randomly initialised.
nn::ExpertsOptions small_experts() {
  nn::ExpertsOptions options;
  options.hidden_size = 64;
  options.num_experts = 8;
  options.intermediate_size = 32;
  return options;
}

// Bit for bit, so that -0.0 and +0.0 differ (at::equal calls them equal).
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  const auto bits = a.element_size() == 4 ? at::kInt : at::kShort;
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         at::equal(a.contiguous().view(bits), b.contiguous().view(bits));
}
}  // namespace

TEST_CASE("one decoded token takes the direct experts path and gets the grouped loop's numbers exactly", "[moe]") {
  at::manual_seed(7);
  nn::FusedExperts experts(small_experts());
  at::NoGradGuard no_grad;
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    experts.to(dtype);
    const auto hidden = at::randn({2, 64}).to(dtype);
    // Three experts a token (two sums commute exactly, three do not), row 0's out of order: the sum
    // must still run in ascending expert order. The rows share no expert, so every expert of the
    // two-token grouped loop runs on one row, the same product as the one-token path's.
    const auto indices = at::tensor(std::vector<int64_t>{6, 1, 4, 0, 3, 7}).view({2, 3});
    const auto weights = at::tensor(std::vector<float>{0.5f, 0.3f, 0.2f, 0.6f, 0.3f, 0.1f}).view({2, 3}).to(dtype);
    const auto two_tokens = experts.forward_grouped(hidden, indices, weights);  // the sorted, gathered loop
    for (int64_t t = 0; t < 2; ++t) {
      for (const auto id_type : {at::kLong, at::kInt}) {
        const auto ids = indices.narrow(0, t, 1).to(id_type);
        const auto one = experts.forward_grouped(hidden.narrow(0, t, 1), ids, weights.narrow(0, t, 1));
        const auto eager = experts.forward_eager(hidden.narrow(0, t, 1), ids, weights.narrow(0, t, 1));
        INFO(c10::toString(dtype) << " token " << t << ": max |one - grouped| = "
                                  << (one - two_tokens.narrow(0, t, 1)).abs().max().item<double>());
        CHECK(same_bits(one, two_tokens.narrow(0, t, 1)));
        CHECK(same_bits(one, eager));
      }
    }
    // One expert with weight zero: every output is a zero whose sign the scatter into zeros decides.
    const auto zero = experts.forward_grouped(hidden.narrow(0, 0, 1), indices.narrow(0, 0, 1).narrow(1, 0, 1),
                                              at::zeros({1, 1}).to(dtype));
    CHECK(same_bits(zero, experts.forward_eager(hidden.narrow(0, 0, 1), indices.narrow(0, 0, 1).narrow(1, 0, 1),
                                                at::zeros({1, 1}).to(dtype))));
    // An expert chosen twice (replayed routes may do that): it runs once on two rows, as in the loops.
    const auto twice = at::tensor(std::vector<int64_t>{2, 2}).view({1, 2});
    const auto halves = at::full({1, 2}, 0.5).to(dtype);
    CHECK(same_bits(experts.forward_grouped(hidden.narrow(0, 1, 1), twice, halves),
                    experts.forward_eager(hidden.narrow(0, 1, 1), twice, halves)));
  }
}

TEST_CASE("experts refuse an expert index outside their range, whatever its integer type", "[moe][errors]") {
  nn::FusedExperts experts(small_experts());
  at::NoGradGuard no_grad;
  const auto hidden = at::randn({2, 64});
  const auto weights = at::full({2, 2}, 0.5);
  for (const auto dtype : {at::kLong, at::kInt}) {
    for (const int64_t bad : {int64_t{8}, int64_t{-1}}) {
      const auto indices = at::tensor(std::vector<int64_t>{0, 3, bad, 1}).view({2, 2}).to(dtype);
      CHECK_THROWS_WITH(experts.forward(hidden, indices, weights), Contains("an expert index is outside 0..7"));
    }
    CHECK(experts.forward(hidden, at::tensor(std::vector<int64_t>{0, 7, 2, 1}).view({2, 2}).to(dtype), weights)
              .sizes() == hidden.sizes());
  }
}

namespace {
// Qwen2-MoE's MLP, noting the threads that ran it (the shared expert is its only use in the case).
std::mutex mlp_threads_mutex;
std::set<std::thread::id> mlp_threads;
class ThreadNotingMlp : public qwen2_moe::Qwen2MoeMLP {
 public:
  using Qwen2MoeMLP::Qwen2MoeMLP;
  at::Tensor forward(const at::Tensor& x) override {
    {
      std::lock_guard<std::mutex> lock(mlp_threads_mutex);
      mlp_threads.insert(std::this_thread::get_id());
    }
    return Qwen2MoeMLP::forward(x);
  }
};

// Greedy decoding of row 0's prompt (a batch of one) at `threads` intra-op threads; which threads ran
// the shared expert land in mlp_threads.
GenerationOutput decode_alone(PretrainedModel& model, int threads, const std::vector<std::string>& outputs) {
  const Case c("qwen2_moe_basic");
  const int previous = at::get_num_threads();
  at::set_num_threads(threads);
  mlp_threads.clear();
  GenerationConfig greedy;
  greedy.max_new_tokens = 6;
  greedy.output_logits = true;
  greedy.outputs = outputs;
  auto out = generate(model, c.get("input_ids").narrow(0, 0, 1), {}, greedy);
  at::set_num_threads(previous);
  return out;
}
}  // namespace

TEST_CASE("a decoded token's shared expert runs beside the routed experts on a second thread, with the same numbers",
          "[moe][threads]") {
  ScopedPatchMapping patch({{"Qwen2MoeMLP", module_class<ThreadNotingMlp>("ThreadNotingMlp")}});
  const auto model = load(Case("qwen2_moe_basic"), "grouped");
  const auto one = decode_alone(*model, 1, {});
  CHECK(mlp_threads == std::set<std::thread::id>{std::this_thread::get_id()});
  const auto two = decode_alone(*model, 2, {});
  // The prompt's forward (several tokens) stays on this thread; decoding steps run it on the other.
  CHECK(mlp_threads.size() == 2);
  CHECK(at::equal(one.sequences, two.sequences));
  // A capture records its own thread's calls: while one is open everything stays on this thread.
  const auto captured = decode_alone(*model, 2, {"router_logits"});
  CHECK(mlp_threads == std::set<std::thread::id>{std::this_thread::get_id()});
  CHECK(at::equal(captured.sequences, one.sequences));
  // The same numbers with the shared expert beside the routed ones as after them, bit for bit where
  // every product is torchpatch's own (LibTorch 1.13). On LibTorch 2.x the prompt's products and
  // attention are LibTorch's (MKL, the fused attention), which round differently with the threads
  // they get, as do some of its operations inside the decode team's region: within 1e-5 there.
  for (size_t step = 0; step < one.logits.size(); ++step) {
#if TORCH_VERSION_MAJOR < 2
    INFO("step " << step << ": max |beside - after| = " << (two.logits[step] - captured.logits[step]).abs().max().item<double>());
    CHECK(same_bits(two.logits[step], captured.logits[step]));
#else
    CHECK(testutil::close("step " + std::to_string(step) + " beside vs after", two.logits[step], captured.logits[step],
                          {}, 1e-5, 1e-5));
#endif
  }
}
