// BERT against the Python original (tests/data/bert_model, see its manifest.json), its task head,
// checkpoint prefixes and legacy names, decoder mode with cross-attention, and the `.*Attention` trap.
#include "test_prelude.h"
#include "test_util.h"
#include "cli_util.h"

#include <unistd.h>
#include <atomic>
#include <fstream>
#include <cmath>
#include <set>

#include "torchpatch/checkpoint/load.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/error.h"
#include "torchpatch/models/bert.h"
#include "torchpatch/models/llama.h"
#include "torchpatch/models/sentence_pooling.h"
#include "torchpatch/patching/build.h"
#include "torchpatch/patching/registry.h"

using namespace torchpatch;
using Catch::Matchers::Contains;

namespace {

std::filesystem::path case_dir() { return testutil::data_dir() / "bert_model"; }

at::Tensor reference(const std::string& name) {
  static auto file = checkpoint::SafetensorsFile::open(case_dir() / "reference.safetensors");
  return file->tensor(name);
}

ModelInputs batch_inputs() {
  ModelInputs in;
  in.input_ids = reference("input_ids");
  in.attention_mask = reference("attention_mask");
  in.token_type_ids = reference("token_type_ids");
  return in;
}

PretrainedOptions as_class(const std::string& cls, bool strict = true) {
  PretrainedOptions options;
  options.strict = strict;
  options.config_overrides = {{"architectures", {cls}}};
  return options;
}

std::filesystem::path temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("torchpatch-bert-" + std::to_string(::getpid()) + "-" + name);
  std::filesystem::remove_all(dir);
  return dir;
}

// A self-attention replacement: the built-in one, counting its calls.
std::atomic<int> self_attention_calls{0};
class CountingSelfAttention : public bert::BertSelfAttention {
 public:
  using bert::BertSelfAttention::BertSelfAttention;
  at::Tensor forward(const at::Tensor& hidden, const BertAttentionInputs& inputs) override {
    ++self_attention_calls;
    return bert::BertSelfAttention::forward(hidden, inputs);
  }
};

void check_against_reference(PretrainedModel& model) {
  at::NoGradGuard no_grad;
  auto in = batch_inputs();
  in.output_hidden_states = true;
  const auto out = model.forward(in);
  const auto mask = in.attention_mask;
  CHECK(testutil::close("last_hidden_state", out.last_hidden_state, reference("last_hidden_state"), mask));
  REQUIRE(out.hidden_states.size() == 3);
  CHECK(testutil::close("embedding_output", out.hidden_states[0], reference("embedding_output"), mask));
  CHECK(testutil::close("hidden_states", at::stack(out.hidden_states), reference("hidden_states"), mask.unsqueeze(0)));
  if (out.pooler_output.defined()) {
    CHECK(testutil::close("pooler_output", out.pooler_output.unsqueeze(1), reference("pooler_output").unsqueeze(1)));
  }
}

}  // namespace

TEST_CASE("bert_model: right-padded batch with token types matches the reference", "[bert][reference]") {
  auto model = from_pretrained(case_dir());
  REQUIRE(model->class_name() == "BertModel");
  check_against_reference(*model);
  // The pooler is there, and its output matches.
  at::NoGradGuard no_grad;
  const auto out = model->forward(batch_inputs());
  REQUIRE(out.pooler_output.defined());
  CHECK(testutil::close("pooler_output", out.pooler_output.unsqueeze(1), reference("pooler_output").unsqueeze(1)));
  CHECK_FALSE(out.logits.defined());
}

TEST_CASE("bert_model: each unpadded row alone matches its reference", "[bert][reference]") {
  auto model = from_pretrained(case_dir());
  at::NoGradGuard no_grad;
  for (int row = 0; row < 2; ++row) {
    const std::string name = "row" + std::to_string(row);
    ModelInputs in;
    in.input_ids = reference(name + "_input_ids");
    in.token_type_ids = reference("token_type_ids").narrow(0, row, 1).narrow(1, 0, in.input_ids.size(1));
    const auto out = model->forward(in);
    CHECK(testutil::close(name + "_last_hidden_state", out.last_hidden_state, reference(name + "_last_hidden_state")));
    CHECK(testutil::close(name + "_pooler_output", out.pooler_output.unsqueeze(1),
                          reference(name + "_pooler_output").unsqueeze(1)));
  }
}

TEST_CASE("bert_model: every class is a patch point under its Hugging Face name", "[bert][patching]") {
  auto model = from_pretrained(case_dir());
  std::map<std::string, std::string> keys;
  for (const auto& point : model->patch_points()) keys[point.path] = point.module->patch_record().key;
  CHECK(keys.at("embeddings") == "BertEmbeddings");
  CHECK(keys.at("encoder") == "BertEncoder");
  CHECK(keys.at("encoder.layer.1") == "BertLayer");
  CHECK(keys.at("encoder.layer.1.attention") == "BertAttention");
  CHECK(keys.at("encoder.layer.1.attention.self") == "BertSelfAttention");
  CHECK(keys.at("encoder.layer.1.attention.output") == "BertSelfOutput");
  CHECK(keys.at("encoder.layer.1.intermediate") == "BertIntermediate");
  CHECK(keys.at("encoder.layer.1.output") == "BertOutput");
  CHECK(keys.at("pooler") == "BertPooler");
  CHECK(model->patch_record().key == "BertModel");
  CHECK(patch_point_role("BertCrossAttention") == "BertCrossAttention");
  CHECK(patch_point_role("BertForMaskedLM") == "BertForMaskedLM");
}

TEST_CASE("The .*Attention trap: a self-attention replacement hitting BertAttention is an error", "[bert][patching]") {
  const auto counting = module_class<CountingSelfAttention>("CountingSelfAttention");
  {
    ScopedPatchMapping patch({{".*Attention", counting}});
    try {
      from_pretrained(case_dir());
      FAIL("building BERT with '.*Attention' -> a self-attention class should fail");
    } catch (const PatchError& e) {
      const std::string text = e.what();
      INFO(text);
      CHECK_THAT(text, Contains("'BertAttention'"));
      CHECK_THAT(text, Contains("'.*Attention'"));
      CHECK_THAT(text, Contains("needs role BertAttention"));
      CHECK_THAT(text, Contains("of role BertSelfAttention"));
      CHECK_THAT(text, Contains("'.*SelfAttention$'"));
    }
  }
  // A decoder attention class under the same pattern: the suggestion spells out the decoder keys.
  {
    ModuleClass decoder_attention = module_class<llama::LlamaAttention>("LlamaAttention");
    ScopedPatchMapping patch({{".*Attention", decoder_attention}});
    // Every decoder family's attention key, and no BERT key, in one anchored alternation.
    try {
      from_pretrained(case_dir());
      FAIL("a decoder attention under '.*Attention' built a BERT model");
    } catch (const PatchError& e) {
      const std::string what = e.what();
      const auto start = what.find("use a narrower pattern such as '^(");
      REQUIRE(start != std::string::npos);
      const auto pattern = what.substr(start, what.find(")$'", start) - start);
      for (const char* key : {"|GemmaAttention|", "|LlamaAttention|", "|MixtralAttention|", "|Qwen3MoeAttention|"}) {
        CHECK_THAT(pattern, Contains(key));
      }
      CHECK_THAT(pattern, !Contains("Bert"));
    }
  }
  // The suggested pattern works, and changes nothing numerically.
  ScopedPatchMapping patch({{".*SelfAttention$", counting}});
  auto model = from_pretrained(case_dir());
  for (const auto& point : model->patch_points()) {
    if (point.path == "encoder.layer.0.attention.self") {
      CHECK(point.module->patch_record().class_name == "CountingSelfAttention");
      CHECK(point.module->patch_record().rule == "pattern '.*SelfAttention$'");
    }
    if (point.path == "encoder.layer.0.attention") CHECK(point.module->patch_record().class_name == "BertAttention");
  }
  self_attention_calls = 0;
  check_against_reference(*model);
  CHECK(self_attention_calls == 2);
}

TEST_CASE("BertForMaskedLM: base checkpoint in, prefixed checkpoint out, tied decoder", "[bert][checkpoint]") {
  // A base checkpoint lacks the prediction head: strict loading says so, naming the keys.
  try {
    from_pretrained(case_dir(), as_class("BertForMaskedLM"));
    FAIL("strict loading of a base checkpoint into BertForMaskedLM should fail");
  } catch (const CheckpointError& e) {
    CHECK_THAT(e.what(), Contains("missing tensor 'cls.predictions.bias'"));
    CHECK_THAT(e.what(), Contains("missing tensor 'cls.predictions.transform.dense.weight'"));
    CHECK_THAT(e.what(), !Contains("missing tensor 'bert."));
    CHECK_THAT(e.what(), !Contains("cls.predictions.decoder.weight"));
  }
  checkpoint::LoadReport report;
  auto model = from_pretrained(case_dir(), as_class("BertForMaskedLM", /*strict=*/false), &report);
  REQUIRE(model->class_name() == "BertForMaskedLM");
  CHECK(report.missing == std::vector<std::string>{"cls.predictions.bias", "cls.predictions.transform.LayerNorm.bias",
                                                   "cls.predictions.transform.LayerNorm.weight",
                                                   "cls.predictions.transform.dense.bias",
                                                   "cls.predictions.transform.dense.weight"});
  // The pooler's tensors have no place in the masked-LM model: ignored, as Hugging Face does.
  CHECK(report.unexpected.empty());
  CHECK(std::set<std::string>(report.ignored.begin(), report.ignored.end()) ==
        std::set<std::string>{"pooler.dense.bias", "pooler.dense.weight"});
  check_against_reference(*model);

  // Logits: the transform, then the embedding table itself as decoder weight, plus the head's bias.
  auto& mlm = dynamic_cast<bert::BertForMaskedLM&>(*model);
  {
    at::NoGradGuard no_grad;
    mlm.predictions->bias.normal_();  // so the bias tie is visible in the logits
    const auto out = model->forward(batch_inputs());
    const auto& head = *mlm.predictions;
    auto h = at::gelu(head.transform_dense->forward(out.last_hidden_state));
    h = at::layer_norm(h, {h.size(-1)}, head.transform_norm->weight, head.transform_norm->bias, 1e-12);
    const auto table = checkpoint::SafetensorsFile::open(case_dir() / "model.safetensors")
                           ->tensor("embeddings.word_embeddings.weight");
    const auto expected = at::linear(h, table, head.bias);
    CHECK(testutil::close("logits", out.logits, expected, {}, 1e-5, 1e-5));
  }
  CHECK(mlm.predictions->decoder_weight.is_same(mlm.bert->named_parameters()["embeddings.word_embeddings.weight"]));

  // Saved with the `bert.` prefix, tied tensors left out; loads back strictly and bit-exactly.
  const auto dir = temp_dir("mlm");
  checkpoint::save_pretrained(*model, dir);
  const auto saved = checkpoint::Checkpoint::open(dir);
  std::set<std::string> keys(saved.keys().begin(), saved.keys().end());
  CHECK(keys.count("bert.embeddings.word_embeddings.weight") == 1);
  CHECK(keys.count("cls.predictions.bias") == 1);
  CHECK(keys.count("cls.predictions.decoder.weight") == 0);
  CHECK(keys.count("cls.predictions.decoder.bias") == 0);
  auto reloaded = from_pretrained(dir);
  REQUIRE(reloaded->class_name() == "BertForMaskedLM");
  {
    at::NoGradGuard no_grad;
    const auto a = model->forward(batch_inputs()).logits, b = reloaded->forward(batch_inputs()).logits;
    CHECK(at::equal(a, b));
  }

  // The head checkpoint into the base model: the prefix is stripped, the head's tensors ignored.
  checkpoint::LoadReport base_report;
  auto base = from_pretrained(dir, as_class("BertModel", /*strict=*/false), &base_report);
  CHECK(base_report.ignored.size() == 5);  // cls.predictions.bias, cls.predictions.transform.*
  CHECK(base_report.unexpected.empty());
  CHECK(base_report.missing == std::vector<std::string>{"pooler.dense.bias", "pooler.dense.weight"});
  at::NoGradGuard no_grad;
  CHECK(testutil::close("base last_hidden_state", base->forward(batch_inputs()).last_hidden_state,
                        reference("last_hidden_state"), batch_inputs().attention_mask));
  std::filesystem::remove_all(dir);
}

TEST_CASE("BertForMaskedLM: masked-LM loss over the labelled positions", "[bert][training]") {
  auto model = from_pretrained(case_dir(), as_class("BertForMaskedLM", /*strict=*/false));
  auto in = batch_inputs();
  in.labels = at::full({2, 12}, -100, at::kLong);
  in.labels.index_put_({0, 3}, 17);
  in.labels.index_put_({1, 5}, 200);
  const auto out = model->forward(in);
  const auto picked = at::stack({out.logits[0][3], out.logits[1][5]});
  const auto expected = at::cross_entropy_loss(picked, at::tensor(std::vector<int64_t>{17, 200}));
  const double diff = (out.loss - expected).abs().item<double>();
  CHECK(diff < 1e-6);
  out.loss.backward();
  CHECK(model->named_parameters()["bert.embeddings.word_embeddings.weight"].grad().abs().sum().item<double>() > 0);
}

namespace {

// The case's tensors under their legacy names (LayerNorm.gamma / beta), keys prefixed with `prefix`.
std::vector<std::pair<std::string, at::Tensor>> legacy_tensors(const std::string& prefix, int& renamed) {
  const auto original = checkpoint::Checkpoint::open(case_dir());
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& key : original.keys()) {
    std::string name = key;
    for (const auto& [now, old] : {std::pair<std::string, std::string>{"LayerNorm.weight", "LayerNorm.gamma"},
                                   {"LayerNorm.bias", "LayerNorm.beta"}}) {
      const auto at = name.find(now);
      if (at != std::string::npos) {
        name.replace(at, now.size(), old);
        ++renamed;
      }
    }
    out.emplace_back(prefix + name, original.tensor(key));
  }
  return out;
}

std::filesystem::path write_case(const std::string& name, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  const auto dir = temp_dir(name);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(case_dir() / "config.json", dir / "config.json");
  checkpoint::save_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

}  // namespace

TEST_CASE("bert_model: legacy LayerNorm.gamma / beta names load", "[bert][checkpoint]") {
  int renamed = 0;
  const auto dir = write_case("legacy", legacy_tensors("", renamed));
  CHECK(renamed == 10);  // embeddings + 2 per layer, weight and bias each
  auto model = from_pretrained(dir);
  check_against_reference(*model);
  std::filesystem::remove_all(dir);
}

TEST_CASE("A pre-training checkpoint in the old hub layout loads strictly into BertModel and BertForMaskedLM",
          "[bert][checkpoint]") {
  // As bert-base-uncased stores it: `bert.` prefix, gamma/beta, the position_ids buffer, the masked-LM
  // head with its decoder weight (the embedding table) and the next-sentence head.
  int renamed = 0;
  auto tensors = legacy_tensors("bert.", renamed);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  auto random = [&](std::vector<int64_t> shape) { return at::randn(shape, gen, at::TensorOptions()); };
  const auto table = checkpoint::Checkpoint::open(case_dir()).tensor("embeddings.word_embeddings.weight");
  const auto head_bias = random({256});
  for (auto& item : std::vector<std::pair<std::string, at::Tensor>>{
           {"bert.embeddings.position_ids", at::arange(64, at::kLong).unsqueeze(0)},
           {"cls.predictions.bias", head_bias},
           {"cls.predictions.transform.dense.weight", random({64, 64}) / 8.0},
           {"cls.predictions.transform.dense.bias", random({64})},
           {"cls.predictions.transform.LayerNorm.gamma", 1.0 + 0.1 * random({64})},
           {"cls.predictions.transform.LayerNorm.beta", random({64})},
           {"cls.predictions.decoder.weight", table},
           {"cls.seq_relationship.weight", random({2, 64})},
           {"cls.seq_relationship.bias", random({2})}}) {
    tensors.push_back(item);
  }
  const auto dir = write_case("pretraining", tensors);

  checkpoint::LoadReport base_report;
  auto base = from_pretrained(dir, as_class("BertModel"), &base_report);
  check_against_reference(*base);  // pooler included
  CHECK(base_report.ignored.size() == 8);  // the two heads' tensors

  checkpoint::LoadReport mlm_report;
  auto mlm = from_pretrained(dir, as_class("BertForMaskedLM"), &mlm_report);
  check_against_reference(*mlm);
  CHECK(std::set<std::string>(mlm_report.ignored.begin(), mlm_report.ignored.end()) ==
        std::set<std::string>{"bert.pooler.dense.bias", "bert.pooler.dense.weight", "cls.seq_relationship.bias",
                              "cls.seq_relationship.weight"});
  const auto& head = *dynamic_cast<bert::BertForMaskedLM&>(*mlm).predictions;
  CHECK(at::equal(head.bias, head_bias));
  CHECK(at::equal(head.decoder_weight, table));
  std::filesystem::remove_all(dir);
}

TEST_CASE("BERT in decoder mode: causal self-attention and cross-attention", "[bert][decoder]") {
  auto json = ModelConfig::from_file(case_dir()).raw;
  json["is_decoder"] = true;
  json["add_cross_attention"] = true;
  const auto config = ModelConfig::from_json(json, "bert decoder");
  auto model = from_config(config);
  init_random_weights(*model, 7);
  std::map<std::string, std::string> keys;
  for (const auto& point : model->patch_points()) keys[point.path] = point.module->patch_record().class_name;
  CHECK(keys.at("encoder.layer.0.crossattention") == "BertAttention");
  CHECK(keys.at("encoder.layer.0.crossattention.self") == "BertCrossAttention");
  CHECK(keys.at("encoder.layer.0.crossattention.output") == "BertSelfOutput");

  at::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  ModelInputs in;
  in.input_ids = at::randint(1, 256, {1, 10}, gen, at::kLong);
  in.encoder_hidden_states = at::randn({1, 6, 64}, gen, at::TensorOptions());
  const auto full = model->forward(in).last_hidden_state;

  // Causal: the first 6 positions do not see what follows them.
  ModelInputs prefix = in;
  prefix.input_ids = in.input_ids.narrow(1, 0, 6);
  CHECK(testutil::close("causal prefix", model->forward(prefix).last_hidden_state, full.narrow(1, 0, 6), {}, 1e-5, 1e-5));

  // Cross-attention reads the encoder states, and a masked encoder token is not read.
  ModelInputs other = in;
  other.encoder_hidden_states = in.encoder_hidden_states.clone();
  other.encoder_hidden_states.narrow(1, 5, 1).normal_(0.0, 1.0, gen);
  const double moved = testutil::max_abs_diff(model->forward(other).last_hidden_state, full);
  CHECK(moved > 1e-3);
  in.encoder_attention_mask = at::ones({1, 6}, at::kLong);
  in.encoder_attention_mask.index_put_({0, 5}, 0);
  other.encoder_attention_mask = in.encoder_attention_mask;
  CHECK(testutil::close("masked encoder token", model->forward(other).last_hidden_state,
                        model->forward(in).last_hidden_state, {}, 1e-6, 1e-6));

  // The cross-attention block against the formula, with its probabilities captured.
  in.outputs = {"cross_attentions", "attentions"};
  const auto captured = model->forward(in).captured;
  REQUIRE(captured.at("cross_attentions").size() == 2);
  REQUIRE(captured.at("attentions").size() == 2);
  const auto& probs = captured.at("cross_attentions")[0];  // [1, 4, 10, 6]
  CHECK(probs.sizes() == at::IntArrayRef({1, 4, 10, 6}));
  CHECK(probs.select(3, 5).abs().max().item<double>() == 0.0);
  const auto self_probs = captured.at("attentions")[0];  // causal: nothing above the diagonal
  CHECK(at::triu(self_probs[0][0], 1).abs().max().item<double>() == 0.0);

  auto& cross = dynamic_cast<bert::BertCrossAttention&>(
      *dynamic_cast<bert::BertAttention&>(*model->named_modules()["encoder.layer.0.crossattention"]).cross_attention);
  const auto x = at::randn({1, 10, 64}, gen, at::TensorOptions());
  BertAttentionInputs inputs;
  inputs.encoder_hidden_states = in.encoder_hidden_states;
  auto heads = [](const at::Tensor& t) { return t.view({1, -1, 4, 16}).transpose(1, 2); };
  const auto q = heads(cross.query->forward(x));
  const auto k = heads(cross.key->forward(inputs.encoder_hidden_states));
  const auto v = heads(cross.value->forward(inputs.encoder_hidden_states));
  const auto expected = at::matmul(at::softmax(at::matmul(q, k.transpose(2, 3)) / 4.0, -1), v).transpose(1, 2).reshape({1, 10, 64});
  CHECK(testutil::close("cross-attention", cross.forward(x, inputs), expected, {}, 1e-5, 1e-5));
}

TEST_CASE("BERT: bad inputs and configs are clear errors", "[bert][errors]") {
  auto model = from_pretrained(case_dir());
  auto in = batch_inputs();
  in.token_type_ids = in.token_type_ids.clone();
  in.token_type_ids.index_put_({1, 2}, 2);
  CHECK_THROWS_WITH(model->forward(in), Contains("token_type_ids: type 2 at [1, 2] is out of range for type_vocab_size 2"));
  in = batch_inputs();
  in.token_type_ids = in.token_type_ids.narrow(1, 0, 5);
  CHECK_THROWS_WITH(model->forward(in), Contains("token_type_ids: shape 2x5 does not match input_ids 2x12"));
  in = batch_inputs();
  in.input_ids = at::ones({1, 65}, at::kLong);
  in.attention_mask = in.token_type_ids = at::Tensor();
  CHECK_THROWS_WITH(model->forward(in), Contains("65 positions is longer than the model supports (max_position_embeddings 64)"));
  in = batch_inputs();
  in.use_cache = true;
  CHECK_THROWS_AS(model->forward(in), InputError);
  in = batch_inputs();
  in.encoder_hidden_states = at::zeros({2, 3, 64});
  CHECK_THROWS_WITH(model->forward(in), Contains("BertModel has no cross-attention"));

  auto json = ModelConfig::from_file(case_dir()).raw;
  json["add_cross_attention"] = true;
  CHECK_THROWS_WITH(ModelConfig::from_json(json, "cfg"), Contains("add_cross_attention needs is_decoder"));
  json = ModelConfig::from_file(case_dir()).raw;
  json["position_embedding_type"] = "relative_key";
  CHECK_THROWS_WITH(ModelConfig::from_json(json, "cfg"), Contains("position_embedding_type 'relative_key'"));
  json = ModelConfig::from_file(case_dir()).raw;
  json["hidden_act"] = "mish";
  CHECK_THROWS_WITH(from_config(ModelConfig::from_json(json, "cfg")), Contains("unsupported activation 'mish'"));
}

TEST_CASE("sentence-transformers pooling: what torchpatch cannot run is a ConfigError naming it", "[bert][pooling]") {
  const testutil::ScratchDir dir("st-pooling");
  const auto write = [&](const std::filesystem::path& file, const std::string& text) {
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file) << text;
  };
  CHECK_FALSE(read_sentence_pooling(dir.path).has_value());  // no modules.json: not such a checkpoint
  const std::string transformer = R"({"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"})";
  const std::string pooling = R"({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})";
  write(dir.path / "1_Pooling" / "config.json", R"({"pooling_mode_mean_tokens": true})");
  write(dir.path / "modules.json", "[" + transformer + "," + pooling + "]");
  const auto mean = read_sentence_pooling(dir.path);
  REQUIRE(mean.has_value());
  CHECK(mean->mode == SentencePooling::Mode::kMean);
  CHECK_FALSE(mean->normalize);
  // The pooled values: the mean of the real tokens, or the largest; padding never counts.
  const auto hidden = at::tensor(std::vector<float>{1, 2, 3, 4, 100, -100}).view({1, 3, 2});
  const auto mask = at::tensor(std::vector<int64_t>{1, 1, 0}).view({1, 3});
  CHECK(at::equal(pool_sentences(hidden, mask, *mean), at::tensor(std::vector<float>{2, 3}).view({1, 2})));
  CHECK(at::equal(pool_sentences(hidden, mask, {SentencePooling::Mode::kMax, false}),
                  at::tensor(std::vector<float>{3, 4}).view({1, 2})));

  write(dir.path / "modules.json", "[" + transformer + "," + pooling +
                                       R"(, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}])");
  CHECK_THROWS_WITH(read_sentence_pooling(dir.path),
                    Contains("module 2 is 'sentence_transformers.models.Dense', which torchpatch does not run"));
  write(dir.path / "modules.json", "[" + transformer + "," + pooling + "]");
  write(dir.path / "1_Pooling" / "config.json", R"({"pooling_mode_lasttoken": true})");
  CHECK_THROWS_WITH(read_sentence_pooling(dir.path),
                    Contains("pooling_mode_lasttoken is a pooling torchpatch does not implement"));
  write(dir.path / "1_Pooling" / "config.json", R"({"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true})");
  CHECK_THROWS_WITH(read_sentence_pooling(dir.path), Contains("set exactly one of") && Contains("(2 are set)"));
  write(dir.path / "modules.json", "[" + transformer + "]");
  CHECK_THROWS_AS(read_sentence_pooling(dir.path), ConfigError);
}
