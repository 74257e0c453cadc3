// Gemma and Phi-3 against the Python original: tests/data/gemma_basic and tests/data/phi3_fused (see
// their manifest.json), through the C++ API and the CLI; and Gemma2's soft-capping, four norms and
// sliding window on a tiny random model (no reference case covers Gemma2).
// Floats at atol 1e-4 / rtol 1e-4 (real tokens only), token ids exactly.
#include "test_prelude.h"
#include "test_util.h"
#include "cli_util.h"

#include <cstring>

#include <nlohmann/json.hpp>

#include "torchpatch/checkpoint/load.h"
#include "torchpatch/generation/generate.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/plugin_host.h"

using namespace torchpatch;
namespace fs = std::filesystem;

namespace {

struct Case {
  std::string name;
  fs::path dir;
  std::shared_ptr<checkpoint::SafetensorsFile> ref;
  explicit Case(const std::string& case_name)
      : name(case_name),
        dir(testutil::data_dir() / case_name),
        ref(checkpoint::SafetensorsFile::open(dir / "reference.safetensors")) {}
  at::Tensor get(const std::string& tensor) const { return ref->tensor(tensor); }
};

// Phi-3 is not built in: it comes from the bundled phi3 plugin (plugins/phi3), which registers the
// family when it is loaded. The CLI loads the bundled plugins by itself; API tests load them here,
// before from_pretrained. Once per process (plugins are never loaded twice).
void load_bundled_plugins() {
  static PluginHost host;
  static const bool loaded = [] {
    host.load_directory(TORCHPATCH_BUNDLED_PLUGIN_DIR, PluginMode::Catalogue);
    for (const auto& p : host.refused()) std::cout << "bundled plugin " << p.path << " refused: " << p.reason << "\n";
    return true;
  }();
  (void)loaded;
}

std::shared_ptr<PretrainedModel> load_gemma(const Case& c) {
  auto model = from_pretrained(c.dir);
  REQUIRE(model->class_name() == "GemmaForCausalLM");
  return model;
}

std::shared_ptr<PretrainedModel> load_phi3(const Case& c) {
  load_bundled_plugins();
  auto model = from_pretrained(c.dir);
  REQUIRE(model->class_name() == "Phi3ForCausalLM");
  return model;
}

// The padded batch (input_ids, attention_mask, position_ids) with hidden states, then each row alone.
void check_forward(PretrainedModel& model, const Case& c) {
  at::NoGradGuard no_grad;
  ModelInputs in;
  in.input_ids = c.get("input_ids");
  in.attention_mask = c.get("attention_mask");
  in.position_ids = c.get("position_ids");
  in.output_hidden_states = true;
  const auto out = model.forward(in);
  CHECK(testutil::close(c.name + " logits", out.logits, c.get("logits"), in.attention_mask));
  REQUIRE(static_cast<int64_t>(out.hidden_states.size()) == c.get("hidden_states").size(0));  // layers + 1
  CHECK(testutil::close(c.name + " hidden_states", at::stack(out.hidden_states), c.get("hidden_states"),
                        in.attention_mask.unsqueeze(0)));
  for (int row = 0; row < 2; ++row) {
    const auto prefix = "row" + std::to_string(row) + "_";
    ModelInputs alone;
    alone.input_ids = c.get(prefix + "input_ids");
    CHECK(testutil::close(c.name + " " + prefix + "logits", model.forward(alone).logits, c.get(prefix + "logits")));
  }
}

// Greedy, 8 new tokens, never stopping early: what the reference cases ran.
GenerationConfig reference_greedy() {
  GenerationConfig config;
  config.max_new_tokens = 8;
  config.output_logits = true;
  return config;
}

// Generates for the padded batch and for each row alone; ids exactly, step logits within 1e-4.
void check_generation(PretrainedModel& model, const Case& c) {
  const auto batch = generate(model, c.get("input_ids"), c.get("attention_mask"), reference_greedy());
  CHECK(at::equal(batch.sequences, c.get("generated_ids")));
  REQUIRE(batch.logits.size() == 8);
  CHECK(testutil::close(c.name + " generated_logits", at::stack(batch.logits), c.get("generated_logits")));
  for (int row = 0; row < 2; ++row) {
    const auto prefix = "row" + std::to_string(row) + "_";
    const auto alone = generate(model, c.get(prefix + "input_ids"), {}, reference_greedy());
    INFO(c.name << " row " << row);
    CHECK(at::equal(alone.sequences, c.get(prefix + "generated_ids")));
    REQUIRE(alone.logits.size() == 8);
    CHECK(testutil::close(c.name + " " + prefix + "generated_logits", at::stack(alone.logits),
                          c.get(prefix + "generated_logits")));
  }
}

// torchpatch run (logits, hidden states) and generate (ids, step logits) write the reference outputs.
void check_cli(const Case& c) {
  const auto mask = c.get("attention_mask");
  const auto run_out = testutil::temp_file(c.name + "-run.safetensors");
  const auto run = testutil::torchpatch_cli("run --model " + c.dir.string() + " --inputs " +
                                            (c.dir / "reference.safetensors").string() + " --hidden-states --output " +
                                            run_out.string());
  {
    INFO(run.out);
    REQUIRE(run.code == 0);
  }
  const auto ran = checkpoint::SafetensorsFile::open(run_out);
  CHECK(testutil::close(c.name + " cli logits", ran->tensor("logits"), c.get("logits"), mask));
  CHECK(testutil::close(c.name + " cli hidden_states", ran->tensor("hidden_states"), c.get("hidden_states"),
                        mask.unsqueeze(0)));

  const auto inputs = testutil::temp_file(c.name + "-batch-inputs.safetensors");
  checkpoint::save_safetensors(inputs, {{"input_ids", c.get("input_ids")}, {"attention_mask", mask}});
  const auto gen_out = testutil::temp_file(c.name + "-generated.safetensors");
  const auto gen = testutil::torchpatch_cli("generate --model " + c.dir.string() + " --inputs " + inputs.string() +
                                            " --max-new-tokens 8 --ignore-eos --output " + gen_out.string());
  {
    INFO(gen.out);
    REQUIRE(gen.code == 0);
  }
  const auto generated = checkpoint::SafetensorsFile::open(gen_out);
  CHECK(at::equal(generated->tensor("generated_ids"), c.get("generated_ids")));
  const auto logits = generated->tensor("generated_logits");
  CHECK(logits.scalar_type() == at::kFloat);
  CHECK(testutil::close(c.name + " cli generated_logits", logits, c.get("generated_logits")));
  for (const auto& file : {run_out, inputs, gen_out}) fs::remove(file);
}

// save_pretrained writes exactly the case's own checkpoint back: the same keys, every tensor bit for
// bit (dtype, shape and bytes). As check_saves_hub_layout (test_moe_plugins.cpp) and
// require_same_tensors (test_conversion.cpp) do, which are local to their files.
void check_saves_checkpoint_bit_exactly(const PretrainedModel& model, const Case& c) {
  const auto dir = testutil::temp_file(c.name + "-save");
  fs::remove_all(dir);
  checkpoint::save_pretrained(model, dir);
  const auto original = checkpoint::Checkpoint::open(c.dir / "model.safetensors");
  const auto saved = checkpoint::Checkpoint::open(dir / "model.safetensors");
  CHECK(saved.keys() == original.keys());
  for (const auto& key : original.keys()) {
    INFO(key);
    REQUIRE(saved.contains(key));
    const auto x = saved.tensor(key).contiguous(), y = original.tensor(key).contiguous();
    REQUIRE(x.scalar_type() == y.scalar_type());
    REQUIRE(x.sizes() == y.sizes());
    CHECK(std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0);
  }
  fs::remove_all(dir);
}

}  // namespace

// ---- Gemma (built in)

TEST_CASE("gemma_basic: padded batch logits and hidden states, and each row alone, match the reference",
          "[gemma][reference]") {
  Case c("gemma_basic");
  auto model = load_gemma(c);
  check_forward(*model, c);
}

TEST_CASE("gemma_basic: greedy generation matches, batched and per row", "[gemma][reference][generate]") {
  Case c("gemma_basic");
  auto model = load_gemma(c);
  check_generation(*model, c);
}

TEST_CASE("gemma_basic: cli run and generate write the reference outputs", "[gemma][reference][cli]") {
  check_cli(Case("gemma_basic"));
}

// ---- Phi-3 (from the bundled phi3 plugin)

TEST_CASE("phi3_fused: padded batch logits and hidden states, and each row alone, match the reference",
          "[phi3][reference]") {
  Case c("phi3_fused");
  auto model = load_phi3(c);
  check_forward(*model, c);
}

TEST_CASE("phi3_fused: greedy generation matches, batched and per row", "[phi3][reference][generate]") {
  Case c("phi3_fused");
  auto model = load_phi3(c);
  check_generation(*model, c);
}

TEST_CASE("phi3_fused: save_pretrained writes the fused checkpoint back bit-exactly", "[phi3][reference][conversion]") {
  Case c("phi3_fused");
  auto model = load_phi3(c);
  check_saves_checkpoint_bit_exactly(*model, c);
}

TEST_CASE("phi3_fused: cli run and generate write the reference outputs", "[phi3][reference][cli]") {
  check_cli(Case("phi3_fused"));
}

// ---- Gemma2 (no reference case: checked against its definition)

namespace {

nlohmann::json gemma2_json() {
  return {{"model_type", "gemma2"}, {"vocab_size", 256}, {"hidden_size", 64}, {"intermediate_size", 128},
          {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
          {"max_position_embeddings", 128}, {"sliding_window", 4}, {"query_pre_attn_scalar", 16},
          {"attn_logit_softcapping", 50.0}, {"final_logit_softcapping", 5.0}};
}

}  // namespace

TEST_CASE("gemma2: soft-capped logits, four norms per layer, cached decoding past the window equals recomputing",
          "[gemma2][generate]") {
  const auto config = ModelConfig::from_json(gemma2_json());
  CHECK(config.decoder.sliding_window == 4);
  // Even layers slide (Hugging Face's is_sliding = not bool(layer_idx % 2)).
  CHECK(config.decoder.layer_types == std::vector<std::string>{kSlidingAttention, kFullAttention});
  auto model = from_config(config);
  init_random_weights(*model, 0);
  model->eval();
  CHECK(model->class_name() == "Gemma2ForCausalLM");

  // (b) Four norms per layer, under Hugging Face's names.
  const auto params = model->named_parameters();
  for (const char* norm : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                           "post_feedforward_layernorm"}) {
    INFO(norm);
    CHECK(params.contains(std::string("model.layers.0.") + norm + ".weight"));
  }

  // (c) Cached greedy decoding of 6 tokens after a 9-token prompt (past the window of 4 on layer 0)
  // gives each step the logits of a forward over the whole sequence without a cache.
  GenerationConfig greedy;
  greedy.max_new_tokens = 6;
  greedy.output_logits = true;
  const auto prompt = at::tensor(std::vector<int64_t>{3, 141, 59, 26, 5, 35, 89, 79, 32}, at::kLong).unsqueeze(0);
  const auto generated = generate(*model, prompt, {}, greedy);
  REQUIRE(generated.logits.size() == 6);
  at::NoGradGuard no_grad;
  for (int64_t step = 0; step < 6; ++step) {
    ModelInputs in;
    in.input_ids = generated.sequences.narrow(1, 0, 9 + step);
    const auto logits = model->forward(in).logits.select(1, 8 + step);
    CHECK(testutil::close("gemma2 step " + std::to_string(step), logits, generated.logits[step], {}, 1e-4, 1e-4));
  }

  // (a) Final-logit soft-capping: logits = tanh(raw / 5) * 5, raw = lm_head(final norm output). The
  // cap is set below what these random weights reach, so it is what keeps every |logit| below 5.
  ModelInputs in;
  in.input_ids = generated.sequences;
  in.output_hidden_states = true;
  const auto out = model->forward(in);
  const auto head = params.contains("lm_head.weight") ? params["lm_head.weight"] : params["model.embed_tokens.weight"];
  const auto raw = at::matmul(out.hidden_states.back(), head.t());
  std::cout << "gemma2: max |raw logit| = " << raw.abs().max().item<double>()
            << ", max |logit| = " << out.logits.abs().max().item<double>() << "\n";
  CHECK(raw.abs().max().item<double>() > 5.0);
  CHECK(out.logits.abs().max().item<double>() < 5.0);
  CHECK(testutil::close("gemma2 soft-capped logits", out.logits, at::tanh(raw / 5.0) * 5.0));

  // The window matters: with one wider than the sequence (full attention), the same weights differ.
  auto wide_json = gemma2_json();
  wide_json["sliding_window"] = 64;
  auto wide = from_config(ModelConfig::from_json(wide_json));
  for (auto& p : wide->named_parameters()) p.value().copy_(params[p.key()]);
  ModelInputs plain;
  plain.input_ids = generated.sequences;
  const double diff = testutil::max_abs_diff(wide->forward(plain).logits, out.logits);
  std::cout << "gemma2 without its window: max abs diff = " << diff << "\n";
  CHECK(diff > 1e-3);
}

// Phi-3's longrope (hf-semantics 5.9), on a tiny config whose trained length is 8 positions.
namespace {
nlohmann::json phi3_longrope_json() {
  std::vector<double> short_factor(8, 1.0), long_factor;
  for (int i = 0; i < 8; ++i) long_factor.push_back(1.0 + 0.5 * i);
  return {{"model_type", "phi3"}, {"architectures", {"Phi3ForCausalLM"}}, {"vocab_size", 256}, {"hidden_size", 64},
          {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"max_position_embeddings", 32}, {"original_max_position_embeddings", 8},
          {"rope_scaling", {{"type", "longrope"}, {"short_factor", short_factor}, {"long_factor", long_factor}}}};
}
}  // namespace

TEST_CASE("phi3 longrope: short factors up to the trained length, long ones past it, scaled cos/sin",
          "[phi3][rope]") {
  load_bundled_plugins();
  const auto config = ModelConfig::from_json(phi3_longrope_json());
  REQUIRE(config.decoder.rope.kind == nn::RopeKind::kLongrope);
  const nn::RopeOptions options = config.decoder;
  const auto base = 1.0 / at::pow(10000.0, at::arange(0, 16, 2, at::kFloat) / 16.0);
  const auto short_freq = nn::rope_frequencies(options, 8), long_freq = nn::rope_frequencies(options, 9);
  CHECK(testutil::close("longrope short inv_freq", short_freq.inv_freq, base));
  const auto long_factor = at::tensor(std::vector<float>{1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5});
  CHECK(testutil::close("longrope long inv_freq", long_freq.inv_freq, base / long_factor));
  const double expected_scaling = std::sqrt(1 + std::log(32.0 / 8.0) / std::log(8.0));
  CHECK(std::abs(short_freq.attention_scaling - expected_scaling) < 1e-12);
  // "su" and "yarn" are older names of the same scaling; other keys are refused.
  auto su = phi3_longrope_json();
  su["rope_scaling"]["type"] = "su";
  CHECK(ModelConfig::from_json(su).decoder.rope.kind == nn::RopeKind::kLongrope);
  auto extra = phi3_longrope_json();
  extra["rope_scaling"]["factor"] = 2.0;
  CHECK_THROWS_WITH(ModelConfig::from_json(extra), Catch::Matchers::Contains("rope_scaling holds 'factor'"));
}

TEST_CASE("phi3 longrope: generation crossing the trained length recomputes, so every step equals a fresh forward",
          "[phi3][rope][generate]") {
  load_bundled_plugins();
  auto model = from_config(ModelConfig::from_json(phi3_longrope_json()));
  init_random_weights(*model, 3);
  model->eval();
  // 5 prompt tokens and 8 new ones: the sequence passes 8 positions at step 4. The cached keys of the
  // first 8 positions were rotated with the short factors; a fresh forward over 9 rotates every key
  // with the long ones. Only dropping the cache there (as Hugging Face does) makes the two agree.
  GenerationConfig greedy;
  greedy.max_new_tokens = 8;
  greedy.output_logits = true;
  const auto prompt = at::tensor(std::vector<int64_t>{7, 21, 99, 140, 3}, at::kLong).unsqueeze(0);
  const auto generated = generate(*model, prompt, {}, greedy);
  REQUIRE(generated.logits.size() == 8);
  at::NoGradGuard no_grad;
  for (int64_t step = 0; step < 8; ++step) {
    ModelInputs in;
    in.input_ids = generated.sequences.narrow(1, 0, 5 + step);
    const auto fresh = model->forward(in).logits.select(1, 4 + step);
    CHECK(testutil::close("phi3 longrope step " + std::to_string(step), generated.logits[step], fresh, {}, 1e-4, 1e-4));
  }
}
