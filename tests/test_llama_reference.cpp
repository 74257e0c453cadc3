// Llama against the Python original: tests/data/llama_basic (see its manifest.json).
#include "test_prelude.h"
#include "test_util.h"

#include "torchpatch/runtime/auto.h"
#include "torchpatch/models/decoder.h"
#include "torchpatch/nn/rotary.h"
#include "torchpatch/patching/registry.h"
#include "torchpatch/plugin_host.h"

using namespace torchpatch;

namespace {
struct Reference {
  std::shared_ptr<checkpoint::SafetensorsFile> file =
      checkpoint::SafetensorsFile::open(testutil::data_dir() / "llama_basic" / "reference.safetensors");
  at::Tensor get(const std::string& name) const { return file->tensor(name); }
};
}  // namespace

TEST_CASE("llama_basic: padded batch logits and hidden states match the reference", "[llama][reference]") {
  Reference ref;
  auto model = from_pretrained(testutil::data_dir() / "llama_basic");
  REQUIRE(model->class_name() == "LlamaForCausalLM");
  at::NoGradGuard no_grad;
  ModelInputs in;
  in.input_ids = ref.get("input_ids");
  in.attention_mask = ref.get("attention_mask");
  in.position_ids = ref.get("position_ids");
  in.output_hidden_states = true;
  const auto out = model->forward(in);
  CHECK(testutil::close("logits", out.logits, ref.get("logits"), in.attention_mask));
  REQUIRE(out.hidden_states.size() == 4);
  const auto hidden = at::stack(out.hidden_states);
  CHECK(testutil::close("hidden_states", hidden, ref.get("hidden_states"), in.attention_mask.unsqueeze(0)));
}

TEST_CASE("llama_basic: each unpadded row alone matches its reference", "[llama][reference]") {
  Reference ref;
  auto model = from_pretrained(testutil::data_dir() / "llama_basic");
  at::NoGradGuard no_grad;
  for (int row = 0; row < 2; ++row) {
    ModelInputs in;
    in.input_ids = ref.get("row" + std::to_string(row) + "_input_ids");
    const auto out = model->forward(in);
    CHECK(testutil::close("row" + std::to_string(row) + "_logits", out.logits,
                          ref.get("row" + std::to_string(row) + "_logits")));
  }
}

TEST_CASE("llama_basic: rope inv_freq matches the reference", "[llama][reference][rope]") {
  Reference ref;
  const auto config = ModelConfig::from_file(testutil::data_dir() / "llama_basic");
  nn::RotaryEmbedding rope(config.decoder);
  CHECK(testutil::close("rope_inv_freq", rope.inv_freq(), ref.get("rope_inv_freq"), {}, 1e-7, 1e-6));
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
  Reference ref;
  const auto mask = ref.get("attention_mask");
  auto wrong = ref.get("logits").clone();
  // Row 1 is left-padded by 4: position 6 is a real token, position 0 a pad.
  wrong[1][6][3] += 1e-3;  // 10x the tolerance
  CHECK_FALSE(testutil::close("perturbed logits", wrong, ref.get("logits"), mask));
  auto pad_only = ref.get("logits").clone();
  pad_only[1][0][3] += 1.0;  // pads are not compared
  CHECK(testutil::close("perturbed pad", pad_only, ref.get("logits"), mask));
}
