// Gemma and Phi-3 against the Python original: tests/data/gemma_basic and tests/data/phi3_fused (see
// their manifest.json), through the C++ API and the CLI; and Gemma2's soft-capping, four norms and
// sliding window on a tiny random model (no reference case covers Gemma2).
// Floats at atol 1e-4 / rtol 1e-4 (real tokens only), token ids exactly.
#include "test_prelude.h"
#include "reference_case.h"
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

using reference::Case;
using reference::check_cli;
using reference::check_forward;
using reference::check_generation;
using reference::check_saves_checkpoint_bit_exactly;

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
