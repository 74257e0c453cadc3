// from_pretrained on broken checkpoints and configs: each a clear error naming the file and tensor.
#include "test_prelude.h"
#include "test_util.h"

#include <unistd.h>
#include <fstream>

#include "torchpatch/error.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/models/decoder.h"

using namespace torchpatch;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

using Tensors = std::vector<std::pair<std::string, at::Tensor>>;

Tensors reference_weights() {
  auto file = checkpoint::SafetensorsFile::open(testutil::data_dir() / "llama_basic" / "model.safetensors");
  Tensors out;
  for (const auto& info : file->tensors()) out.emplace_back(info.name, file->tensor(info.name).clone());
  return out;
}

nlohmann::json reference_config() {
  return ModelConfig::from_file(testutil::data_dir() / "llama_basic").raw;
}

// A checkpoint directory with the given config and tensors.
fs::path write_checkpoint(const std::string& name, const nlohmann::json& config, const Tensors& tensors) {
  const auto dir = fs::temp_directory_path() / ("torchpatch-ckpt-" + std::to_string(::getpid()) + "-" + name);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);
  checkpoint::save_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

Tensors without(Tensors tensors, const std::string& name) {
  tensors.erase(std::remove_if(tensors.begin(), tensors.end(), [&](const auto& t) { return t.first == name; }),
                tensors.end());
  return tensors;
}

}  // namespace

TEST_CASE("a missing tensor is an error naming file and tensor", "[checkpoint]") {
  const auto dir = write_checkpoint("missing", reference_config(),
                                    without(reference_weights(), "model.layers.1.mlp.up_proj.weight"));
  REQUIRE_THROWS_MATCHES(from_pretrained(dir), CheckpointError,
                         Catch::Matchers::Predicate<CheckpointError>([&](const CheckpointError& e) {
                           const std::string m = e.what();
                           return m.find((dir / "model.safetensors").string()) != std::string::npos &&
                                  m.find("missing tensor 'model.layers.1.mlp.up_proj.weight'") != std::string::npos;
                         }));
}

TEST_CASE("a shape that does not match the model is an error", "[checkpoint]") {
  auto tensors = reference_weights();
  for (auto& [name, t] : tensors) {
    if (name == "model.norm.weight") t = at::ones({32});
  }
  const auto dir = write_checkpoint("shape", reference_config(), tensors);
  REQUIRE_THROWS_WITH(from_pretrained(dir), Contains("tensor 'model.norm.weight' has shape [32] but the model "
                                                     "expects [64]"));
}

TEST_CASE("an unexpected tensor is an error", "[checkpoint]") {
  auto tensors = reference_weights();
  tensors.emplace_back("model.layers.7.extra.weight", at::ones({2}));
  const auto dir = write_checkpoint("unexpected", reference_config(), tensors);
  REQUIRE_THROWS_WITH(from_pretrained(dir), Contains("unexpected tensor 'model.layers.7.extra.weight' (no such parameter)"));
}

TEST_CASE("a truncated checkpoint is an error naming the file", "[checkpoint]") {
  const auto dir = write_checkpoint("truncated", reference_config(), reference_weights());
  const auto file = dir / "model.safetensors";
  fs::resize_file(file, fs::file_size(file) / 2);
  REQUIRE_THROWS_WITH(from_pretrained(dir), Contains(file.string()));
}

TEST_CASE("tied embeddings load from a checkpoint without lm_head.weight", "[checkpoint]") {
  auto config = reference_config();
  config["tie_word_embeddings"] = true;
  const auto dir = write_checkpoint("tied", config, without(reference_weights(), "lm_head.weight"));
  auto model = std::dynamic_pointer_cast<DecoderForCausalLM>(from_pretrained(dir));
  REQUIRE(model);
  CHECK(at::equal(std::dynamic_pointer_cast<torchpatch::TiedLmHead>(model->lm_head)->weight, model->model->embed_tokens->weight));
  at::NoGradGuard no_grad;
  ModelInputs in;
  in.input_ids = at::tensor({3, 1, 4, 1, 5}, at::kLong).unsqueeze(0);
  const auto out = model->forward(in);
  // Tied head: logits are the final hidden states against the embedding table.
  CHECK(testutil::close("tied logits", out.logits, at::matmul(out.last_hidden_state, model->model->embed_tokens->weight.t()),
                        {}, 1e-5, 1e-5));
}

TEST_CASE("config errors name the field", "[config]") {
  auto config = reference_config();
  SECTION("missing model_type") {
    config.erase("model_type");
    REQUIRE_THROWS_WITH(ModelConfig::from_json(config, "x/config.json"),
                        Contains("x/config.json: missing required field 'model_type'"));
  }
  SECTION("unsupported model_type") {
    config["model_type"] = "gpt9";
    REQUIRE_THROWS_WITH(ModelConfig::from_json(config), Contains("model_type 'gpt9' is not supported"));
  }
  SECTION("wrong kind") {
    config["hidden_size"] = "64";
    REQUIRE_THROWS_WITH(ModelConfig::from_json(config), Contains("field 'hidden_size' must be an integer"));
  }
  SECTION("heads do not divide") {
    config["num_key_value_heads"] = 3;
    REQUIRE_THROWS_WITH(ModelConfig::from_json(config), Contains("not a multiple of num_key_value_heads 3"));
  }
  SECTION("llama3 scaling without its fields") {
    config["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
    REQUIRE_THROWS_WITH(ModelConfig::from_json(config), Contains("rope_type 'llama3' needs field 'low_freq_factor'"));
  }
  SECTION("defaults fill what is absent") {
    config.erase("num_key_value_heads");
    config.erase("head_dim");
    config.erase("rms_norm_eps");
    const auto parsed = ModelConfig::from_json(config);
    CHECK(parsed.decoder.num_key_value_heads == parsed.decoder.num_attention_heads);
    CHECK(parsed.decoder.head_dim == 16);
    CHECK(parsed.decoder.rms_norm_eps == 1e-6);
  }
}

TEST_CASE("bad inputs to forward are clear errors", "[llama][inputs]") {
  auto model = from_config(preset_config("tiny-llama"));
  at::NoGradGuard no_grad;
  ModelInputs in;
  in.input_ids = at::tensor({1, 2, 300}, at::kLong).unsqueeze(0);
  REQUIRE_THROWS_WITH(model->forward(in), Contains("token id 300 at [0, 2] is out of range for vocab_size 256"));
  in.input_ids = at::tensor({1, 2, 3}, at::kLong);
  REQUIRE_THROWS_WITH(model->forward(in), Contains("input_ids: expected [batch, seq]"));
  in.input_ids = at::tensor({1, 2, 3}, at::kLong).unsqueeze(0);
  in.attention_mask = at::ones({1, 2}, at::kLong);
  REQUIRE_THROWS_WITH(model->forward(in), Contains("attention_mask: shape 1x2 does not match input_ids 1x3"));
}

TEST_CASE("weights view the mapped checkpoint, or with copy_mapped memory of their own", "[checkpoint]") {
  const auto ckpt = checkpoint::Checkpoint::open(testutil::data_dir() / "llama_basic");
  const auto config = ModelConfig::from_file(testutil::data_dir() / "llama_basic" / "config.json");
  const auto load = [&](bool copy) {
    auto model = from_config(config);
    checkpoint::LoadOptions options;
    options.copy_mapped = copy;
    checkpoint::load_weights(*model, ckpt, options);
    return model;
  };
  const auto mapped = load(false), copied = load(true);
  int64_t views = 0;
  for (const auto& item : mapped->named_parameters()) views += ckpt.maps(item.value().data_ptr()) ? 1 : 0;
  CHECK(views == static_cast<int64_t>(mapped->named_parameters().size()));  // float32 in the file: all adopted
  const auto own = copied->named_parameters();
  for (const auto& item : own) {
    INFO(item.key());
    CHECK_FALSE(ckpt.maps(item.value().data_ptr()));
    CHECK(at::equal(item.value(), ckpt.tensor(item.key())));
  }
  // Copies are the model's own: writing one leaves the checkpoint's bytes as they were.
  at::NoGradGuard no_grad;
  own["lm_head.weight"].zero_();
  CHECK(ckpt.tensor("lm_head.weight").abs().sum().item<double>() > 0);
}
