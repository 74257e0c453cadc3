// Mistral and cached generation against the Python original: tests/data/mistral_sliding_window and
// tests/data/llama_basic (see their manifest.json). Greedy ids must match exactly, step logits to 1e-4.
#include "test_prelude.h"
#include "test_util.h"

#include "torchpatch/generation/generate.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/models/mistral.h"
#include "torchpatch/nn/rotary.h"
#include "torchpatch/patching/registry.h"
#include "torchpatch/plugin_host.h"

using namespace torchpatch;

namespace {

struct Case {
  std::filesystem::path dir;
  std::shared_ptr<checkpoint::SafetensorsFile> ref;
  explicit Case(const std::string& name)
      : dir(testutil::data_dir() / name), ref(checkpoint::SafetensorsFile::open(dir / "reference.safetensors")) {}
  at::Tensor get(const std::string& tensor) const { return ref->tensor(tensor); }
};

// Greedy, 8 new tokens, never stopping early: what the reference cases ran.
GenerationConfig reference_greedy() {
  GenerationConfig config;
  config.max_new_tokens = 8;
  config.output_logits = true;
  return config;
}

// Generates for the padded batch and for each row alone; ids exactly, step logits within 1e-4.
void check_generation(PretrainedModel& model, const Case& c, const std::string& label) {
  const auto batch = generate(model, c.get("input_ids"), c.get("attention_mask"), reference_greedy());
  CHECK(at::equal(batch.sequences, c.get("generated_ids")));
  CHECK(testutil::close(label + " generated_logits", at::stack(batch.logits), c.get("generated_logits")));
  for (int row = 0; row < 2; ++row) {
    const auto prefix = "row" + std::to_string(row) + "_";
    const auto alone = generate(model, c.get(prefix + "input_ids"), {}, reference_greedy());
    INFO(label << " row " << row);
    CHECK(at::equal(alone.sequences, c.get(prefix + "generated_ids")));
    CHECK(testutil::close(label + " " + prefix + "generated_logits", at::stack(alone.logits),
                          c.get(prefix + "generated_logits")));
  }
}

}  // namespace

TEST_CASE("mistral_sliding_window: config, classes and rope", "[mistral][reference]") {
  Case c("mistral_sliding_window");
  const auto config = ModelConfig::from_file(c.dir);
  CHECK(config.decoder.sliding_window == 4);
  CHECK(config.decoder.layer_types == std::vector<std::string>{kSlidingAttention, kSlidingAttention});
  CHECK(config.decoder.head_dim == 16);
  auto model = from_pretrained(c.dir);
  CHECK(model->class_name() == "MistralForCausalLM");
  REQUIRE(std::dynamic_pointer_cast<mistral::MistralForCausalLM>(model));
  std::vector<std::string> classes;
  for (const auto& point : model->patch_points()) classes.push_back(point.module->patch_record().class_name);
  CHECK(std::count(classes.begin(), classes.end(), "MistralAttention") == 2);
  CHECK(std::count(classes.begin(), classes.end(), "MistralRMSNorm") == 5);
  nn::RotaryEmbedding rope(config.decoder);
  CHECK(testutil::close("rope_inv_freq", rope.inv_freq(), c.get("rope_inv_freq"), {}, 1e-7, 1e-6));
}

TEST_CASE("mistral_sliding_window: padded batch logits and hidden states match", "[mistral][reference]") {
  Case c("mistral_sliding_window");
  auto model = from_pretrained(c.dir);
  at::NoGradGuard no_grad;
  ModelInputs in;
  in.input_ids = c.get("input_ids");
  in.attention_mask = c.get("attention_mask");
  in.position_ids = c.get("position_ids");
  in.output_hidden_states = true;
  const auto out = model->forward(in);
  CHECK(testutil::close("logits", out.logits, c.get("logits"), in.attention_mask));
  CHECK(testutil::close("hidden_states", at::stack(out.hidden_states), c.get("hidden_states"),
                        in.attention_mask.unsqueeze(0)));
  for (int row = 0; row < 2; ++row) {
    ModelInputs alone;
    alone.input_ids = c.get("row" + std::to_string(row) + "_input_ids");
    CHECK(testutil::close("row" + std::to_string(row) + "_logits", model->forward(alone).logits,
                          c.get("row" + std::to_string(row) + "_logits")));
  }
}

TEST_CASE("mistral_sliding_window: the window matters (a full-attention model differs)", "[mistral][reference]") {
  // Guards the test above: with the window turned off the 12-token row must no longer match.
  Case c("mistral_sliding_window");
  auto json = ModelConfig::from_file(c.dir).raw;
  json["sliding_window"] = nullptr;
  const auto config = ModelConfig::from_json(json);
  CHECK_FALSE(config.decoder.sliding_window);
  CHECK(config.decoder.layer_types == std::vector<std::string>{kFullAttention, kFullAttention});
  std::shared_ptr<PretrainedModel> model;
  {
    nn::SkipInit skip;
    model = from_config(config);
  }
  checkpoint::load_weights(*model, checkpoint::Checkpoint::open(c.dir), {});
  at::NoGradGuard no_grad;
  ModelInputs in;
  in.input_ids = c.get("row0_input_ids");
  const double diff = testutil::max_abs_diff(model->forward(in).logits, c.get("row0_logits"));
  std::cout << "full attention vs sliding reference: max abs diff = " << diff << "\n";
  CHECK(diff > 1e-2);
}

TEST_CASE("mistral_sliding_window: greedy generation matches, batched and per row", "[mistral][reference][generate]") {
  Case c("mistral_sliding_window");
  auto model = from_pretrained(c.dir);
  check_generation(*model, c, "mistral");
}

TEST_CASE("llama_basic: greedy generation matches, batched and per row", "[llama][reference][generate]") {
  Case c("llama_basic");
  auto model = from_pretrained(c.dir);
  check_generation(*model, c, "llama");
}

TEST_CASE("generation with FusedQKVAttention matches the reference", "[generate][plugins]") {
  PluginHost host;
  host.load_directory(TORCHPATCH_BUNDLED_PLUGIN_DIR, PluginMode::Catalogue);
  for (const auto& [name, key] : {std::pair<const char*, const char*>{"mistral_sliding_window", "MistralAttention"},
                                  {"llama_basic", "LlamaAttention"}}) {
    const auto fused = host.find_class("FusedQKVAttention");
    REQUIRE(fused);
    ScopedPatchMapping patch({{key, *fused}});
    Case c(name);
    auto model = from_pretrained(c.dir);
    int fused_layers = 0;
    for (const auto& point : model->patch_points()) {
      fused_layers += point.module->patch_record().class_name == "FusedQKVAttention";
    }
    REQUIRE(fused_layers == model->config().decoder.num_hidden_layers);
    check_generation(*model, c, std::string(name) + " fused");
  }
}

TEST_CASE("cached decoding equals recomputing the whole sequence", "[generate][cache]") {
  Case c("mistral_sliding_window");
  auto model = from_pretrained(c.dir);
  const auto prompt = c.get("row0_input_ids");
  const auto generated = generate(*model, prompt, {}, reference_greedy());
  at::NoGradGuard no_grad;
  for (int64_t step = 0; step < 8; ++step) {
    ModelInputs in;
    in.input_ids = generated.sequences.narrow(1, 0, prompt.size(1) + step);
    const auto logits = model->forward(in).logits.select(1, in.input_ids.size(1) - 1);
    CHECK(testutil::close("step " + std::to_string(step), logits, generated.logits[step], {}, 1e-4, 1e-4));
  }
}
