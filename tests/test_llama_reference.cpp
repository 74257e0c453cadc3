// Llama against the Python original: tests/data/llama_basic (see its manifest.json), on the shared
// reference harness (reference_case.h).
#include "test_prelude.h"
#include "reference_case.h"
#include "test_util.h"

#include "torchpatch/runtime/auto.h"
#include "torchpatch/models/decoder.h"
#include "torchpatch/nn/rotary.h"
#include "torchpatch/patching/registry.h"
#include "torchpatch/plugin_host.h"

using namespace torchpatch;

using reference::Case;

TEST_CASE("llama_basic: padded batch logits and hidden states, and each row alone, match the reference",
          "[llama][reference]") {
  const Case c("llama_basic");
  auto model = from_pretrained(c.dir);
  REQUIRE(model->class_name() == "LlamaForCausalLM");
  reference::check_forward(*model, c);
}

TEST_CASE("llama_basic: rope inv_freq matches the reference", "[llama][reference][rope]") {
  const Case c("llama_basic");
  const auto config = ModelConfig::from_file(c.dir);
  nn::RotaryEmbedding rope(config.decoder);
  CHECK(testutil::close("rope_inv_freq", rope.inv_freq(), c.get("rope_inv_freq"), {}, 1e-7, 1e-6));
  CHECK(rope.attention_scaling() == 1.0);
}

TEST_CASE("llama3 rope scaling follows Hugging Face's formula", "[llama][rope]") {
  auto json = ModelConfig::from_file(testutil::data_dir() / "llama_basic").raw;
  json["head_dim"] = 64;
  json["rope_theta"] = 500000.0;
  json["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  const auto config = ModelConfig::from_json(json);
  const auto scaled = nn::rope_frequencies(config.decoder).inv_freq;
  // Derived here element by element in double precision from the definition.
  const int dim = 64;
  const double old_ctx = 8192, low_wavelen = old_ctx / 1.0, high_wavelen = old_ctx / 4.0;
  double worst = 0;
  for (int i = 0; i < dim / 2; ++i) {
    const double f = 1.0 / std::pow(500000.0, (2.0 * i) / dim);
    const double wavelen = 2 * M_PI / f;
    double expected;
    if (wavelen < high_wavelen) {
      expected = f;
    } else if (wavelen > low_wavelen) {
      expected = f / 8.0;
    } else {
      const double smooth = (old_ctx / wavelen - 1.0) / (4.0 - 1.0);
      expected = (1 - smooth) * f / 8.0 + smooth * f;
    }
    worst = std::max(worst, std::abs(scaled[i].item<double>() - expected) / expected);
  }
  std::cout << "llama3 inv_freq: max rel diff = " << worst << "\n";
  CHECK(worst < 1e-5);
}

TEST_CASE("tied embeddings share one tensor and load without lm_head.weight", "[llama][checkpoint]") {
  auto json = ModelConfig::from_file(testutil::data_dir() / "llama_basic").raw;
  json["tie_word_embeddings"] = true;
  const auto config = ModelConfig::from_json(json);
  auto model = std::dynamic_pointer_cast<DecoderForCausalLM>(from_config(config));
  REQUIRE(model);
  CHECK(std::dynamic_pointer_cast<torchpatch::TiedLmHead>(model->lm_head)->weight.data_ptr() == model->model->embed_tokens->weight.data_ptr());
  CHECK(model->tied_weights().at("lm_head.weight") == "model.embed_tokens.weight");
}

TEST_CASE("the reference comparison catches a wrong answer", "[llama][reference]") {
  const Case ref("llama_basic");
  const auto mask = ref.get("attention_mask");
  auto wrong = ref.get("logits").clone();
  // Row 1 is left-padded by 4: position 6 is a real token, position 0 a pad.
  wrong[1][6][3] += 1e-3;  // 10x the tolerance
  CHECK_FALSE(testutil::close("perturbed logits", wrong, ref.get("logits"), mask));
  auto pad_only = ref.get("logits").clone();
  pad_only[1][0][3] += 1.0;  // pads are not compared
  CHECK(testutil::close("perturbed pad", pad_only, ref.get("logits"), mask));
}
