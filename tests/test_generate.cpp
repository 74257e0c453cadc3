// generate(): sampling, stopping, padded batches, bad input; Qwen2's configs and mixed layers.
#include "test_prelude.h"
#include "test_util.h"

#include "torchpatch/error.h"
#include "torchpatch/generation/generate.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/models/qwen2.h"
#include "torchpatch/patching/registry.h"

using namespace torchpatch;
using Catch::Matchers::Contains;

namespace {

std::shared_ptr<PretrainedModel> preset(const std::string& name) {
  auto model = construct_model(preset_config(name));
  init_random_weights(*model, 7);
  model->eval();
  return model;
}

at::Tensor prompt(std::vector<int64_t> ids) { return at::tensor(ids, at::kLong).unsqueeze(0); }

nlohmann::json qwen2_json() {
  return {{"model_type", "qwen2"}, {"vocab_size", 256}, {"hidden_size", 64}, {"intermediate_size", 128},
          {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"max_position_embeddings", 128}};
}

}  // namespace

TEST_CASE("sampling is reproducible with a seed and top_k 1 is greedy", "[generate][sampling]") {
  auto model = preset("tiny-llama");
  GenerationConfig config;
  config.max_new_tokens = 12;
  const auto greedy = generate(*model, prompt({1, 2, 3}), {}, config).sequences;
  config.do_sample = true;
  config.seed = 42;
  const auto a = generate(*model, prompt({1, 2, 3}), {}, config).sequences;
  const auto b = generate(*model, prompt({1, 2, 3}), {}, config).sequences;
  CHECK(at::equal(a, b));
  config.seed = 43;
  config.temperature = 5.0;  // flat enough that another seed takes another path
  CHECK_FALSE(at::equal(generate(*model, prompt({1, 2, 3}), {}, config).sequences, a));
  config.top_k = 1;
  CHECK(at::equal(generate(*model, prompt({1, 2, 3}), {}, config).sequences, greedy));
}

TEST_CASE("temperature, top-k and top-p remove what Hugging Face's warpers remove", "[generate][sampling]") {
  // Probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 (as logits: their logs).
  const auto logits = at::log(at::tensor({0.0625, 0.5, 0.125, 0.0625, 0.25}, at::kFloat)).unsqueeze(0);
  GenerationConfig config;
  config.do_sample = true;
  config.top_k = 0;
  config.top_p = 0.8;  // keeps 0.5 + 0.25 + 0.125 (the tail 0.125 <= 0.2 goes)
  auto kept = at::isfinite(process_logits(logits, config)).squeeze(0);
  CHECK(at::equal(kept, at::tensor(std::vector<int64_t>{0, 1, 1, 0, 1}).to(at::kBool)));
  config.top_p = 1.0;
  config.top_k = 2;
  kept = at::isfinite(process_logits(logits, config)).squeeze(0);
  CHECK(at::equal(kept, at::tensor(std::vector<int64_t>{0, 1, 0, 0, 1}).to(at::kBool)));
  config.top_k = 0;
  config.temperature = 2.0;
  CHECK(testutil::close("temperature", process_logits(logits, config), logits / 2.0));
  // Sampled tokens always come from the kept set.
  config.temperature = 1.0;
  config.top_p = 0.7;  // keeps 0.5 and 0.25
  auto probs = process_logits(logits.expand({2000, 5}), config).softmax(-1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const auto drawn = at::multinomial(probs, 1, false, gen);
  CHECK(((drawn == 1).logical_or(drawn == 4)).all().item<bool>());
}

TEST_CASE("eos stops a row, pads it while others go on, and ends the run when all stopped", "[generate]") {
  auto model = preset("tiny-llama");
  GenerationConfig config;
  config.max_new_tokens = 6;
  const auto free_run = generate(*model, prompt({5, 6, 7}), {}, config).sequences;
  const int64_t third = free_run[0][5].item<int64_t>();  // the 3rd new token becomes "eos"
  config.eos_token_ids = {third};
  config.pad_token_id = 0;
  const auto stopped = generate(*model, prompt({5, 6, 7}), {}, config);
  const int64_t first_eos = [&] {
    for (int64_t t = 3; t < free_run.size(1); ++t) {
      if (free_run[0][t].item<int64_t>() == third) return t;
    }
    return int64_t{-1};
  }();
  CHECK(stopped.sequences.size(1) == first_eos + 1);
  CHECK(at::equal(stopped.sequences, free_run.narrow(1, 0, first_eos + 1)));
}

TEST_CASE("a left-padded batch generates what each row generates alone", "[generate]") {
  for (const char* name : {"tiny-llama", "tiny-mistral", "tiny-qwen2"}) {
    auto model = preset(name);
    GenerationConfig config;
    config.max_new_tokens = 10;
    const std::vector<int64_t> long_row{9, 8, 7, 6, 5, 4, 3, 9, 8, 7, 6, 5}, short_row{11, 12, 13, 14};
    auto ids = at::zeros({2, 12}, at::kLong), mask = at::zeros({2, 12}, at::kLong);
    ids[0].copy_(at::tensor(long_row));
    mask[0].fill_(1);
    ids[1].narrow(0, 8, 4).copy_(at::tensor(short_row));
    mask[1].narrow(0, 8, 4).fill_(1);
    const auto batch = generate(*model, ids, mask, config).sequences;
    const auto row0 = generate(*model, prompt(long_row), {}, config).sequences;
    const auto row1 = generate(*model, prompt(short_row), {}, config).sequences;
    INFO(name);
    CHECK(at::equal(batch[0].narrow(0, 12, 10), row0[0].narrow(0, 12, 10)));
    CHECK(at::equal(batch[1].narrow(0, 12, 10), row1[0].narrow(0, 4, 10)));
  }
}

TEST_CASE("generate rejects bad input with clear errors", "[generate][errors]") {
  auto model = preset("tiny-llama");  // 256 positions, vocab 256
  GenerationConfig config;
  config.max_new_tokens = 4;
  REQUIRE_THROWS_WITH(generate(*model, at::zeros({1, 0}, at::kLong), {}, config), Contains("input_ids: empty prompt"));
  REQUIRE_THROWS_WITH(generate(*model, prompt({1, 999}), {}, config),
                      Contains("input_ids: token id 999 at [0, 1] is out of range for vocab_size 256"));
  config.max_new_tokens = 300;
  REQUIRE_THROWS_WITH(generate(*model, prompt({1, 2}), {}, config),
                      Contains("prompt of 2 tokens + max_new_tokens 300 = 302 positions, more than the model supports (256"));
  config.max_new_tokens = 4;
  REQUIRE_THROWS_WITH(generate(*model, prompt({1, 2}), at::zeros({1, 2}, at::kLong), config),
                      Contains("attention_mask: a row has no real tokens"));
  REQUIRE_THROWS_WITH(generate(*model, prompt({1, 2}), at::tensor(std::vector<int64_t>{1, 0}).unsqueeze(0), config),
                      Contains("a row ends in padding; generation needs left padding"));
  REQUIRE_THROWS_WITH(generate(*model, prompt({1, 2}), at::ones({1, 3}, at::kLong), config),
                      Contains("attention_mask: shape 1x3 does not match input_ids 1x2"));
  config.do_sample = true;
  config.temperature = 0;
  REQUIRE_THROWS_WITH(generate(*model, prompt({1, 2}), {}, config), Contains("temperature: must be > 0"));
  config.temperature = 1;
  config.top_p = 1.5;
  REQUIRE_THROWS_WITH(generate(*model, prompt({1, 2}), {}, config), Contains("top_p: must be in (0, 1]"));

  // A forward past the positions, and a linear scaling that allows it.
  ModelInputs in;
  in.input_ids = at::ones({1, 300}, at::kLong);
  REQUIRE_THROWS_WITH(model->forward(in), Contains("sequence of 300 positions is longer than the model supports (256"));
  auto json = preset_config("tiny-llama").raw;
  json["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  auto stretched = construct_model(ModelConfig::from_json(json));
  CHECK(stretched->forward(in).logits.size(1) == 300);
}

namespace {
// An attention that ignores the key/value cache (and the past): fine for one pass, wrong for decoding.
class ForgetfulAttention : public roles::Attention {
 public:
  explicit ForgetfulAttention(const BuildContext&) {}
 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const AttentionInputs&) override { return hidden * 0.5; }
};
}  // namespace

TEST_CASE("an attention class that does not fill the cache is a clear error, not silent nonsense", "[generate][errors]") {
  ScopedPatchMapping patch({{"LlamaAttention", module_class<ForgetfulAttention>("ForgetfulAttention")}});
  auto model = from_config(preset_config("tiny-llama"));  // applies the registered patch
  ModelInputs in;
  in.input_ids = prompt({1, 2, 3});
  CHECK(model->forward(in).logits.size(1) == 3);  // without a cache it runs
  REQUIRE_THROWS_WITH(generate(*model, prompt({1, 2, 3}), {}, {}),
                      Contains("layer 0: ForgetfulAttention did not update the key/value cache"));
}

TEST_CASE("bias flags per family: Mistral never, Qwen2 q/k/v only", "[config]") {
  auto mistral = ModelConfig::from_json({{"model_type", "mistral"}, {"attention_bias", true}, {"mlp_bias", true}}).decoder;
  CHECK_FALSE(mistral.qkv_bias);
  CHECK_FALSE(mistral.o_bias);
  CHECK_FALSE(mistral.mlp_bias);
  auto qwen2 = qwen2_json();
  qwen2["attention_bias"] = true;
  const auto d = ModelConfig::from_json(qwen2).decoder;
  CHECK(d.qkv_bias);
  CHECK_FALSE(d.o_bias);
  auto llama = ModelConfig::from_json({{"model_type", "llama"}, {"attention_bias", true}}).decoder;
  CHECK((llama.qkv_bias && llama.o_bias));
  qwen2["use_sliding_window"] = false;
  qwen2["sliding_window"] = 0;  // ignored while the window is off, as in Hugging Face
  CHECK_FALSE(ModelConfig::from_json(qwen2).decoder.sliding_window);
}

TEST_CASE("qwen2 without a window computes what Llama computes with the same weights and q/k/v biases", "[qwen2]") {
  // No Qwen2 reference case exists; Qwen2 is Llama plus q/k/v biases (o_proj's bias held at zero here).
  auto qwen2 = construct_model(ModelConfig::from_json(qwen2_json()));
  init_random_weights(*qwen2, 11);
  auto llama_json = qwen2_json();
  llama_json["model_type"] = "llama";
  llama_json["attention_bias"] = true;
  llama_json["num_key_value_heads"] = 2;
  auto llama = construct_model(ModelConfig::from_json(llama_json));
  const auto source = qwen2->named_parameters();
  {
    at::NoGradGuard guard;
    for (auto& p : llama->named_parameters()) {
      if (source.contains(p.key())) {
        p.value().copy_(source[p.key()]);
      } else {
        REQUIRE(p.key().find("o_proj.bias") != std::string::npos);
        p.value().zero_();
      }
    }
  }
  ModelInputs in;
  in.input_ids = prompt({7, 3, 9, 1, 4, 4, 2});
  at::NoGradGuard guard;
  CHECK(testutil::close("qwen2 vs llama+biases", qwen2->forward(in).logits, llama->forward(in).logits, {}, 1e-6, 1e-6));
}

TEST_CASE("configs missing a required field or with a wrong one are clear errors", "[config][errors]") {
  auto json = qwen2_json();
  json.erase("model_type");
  REQUIRE_THROWS_WITH(ModelConfig::from_json(json), Contains("missing required field 'model_type'"));
  json = qwen2_json();
  json["sliding_window"] = "wide";
  json["use_sliding_window"] = true;
  REQUIRE_THROWS_WITH(ModelConfig::from_json(json), Contains("field 'sliding_window' must be an integer"));
  json = qwen2_json();
  json["layer_types"] = {"full_attention"};
  REQUIRE_THROWS_WITH(ModelConfig::from_json(json), Contains("field 'layer_types' must list 4 entries"));
  json["layer_types"] = {"full_attention", "sliding_attention", "full_attention", "full_attention"};
  REQUIRE_THROWS_WITH(ModelConfig::from_json(json), Contains("layer_types[1] is sliding_attention but the config has "
                                                             "no sliding window"));
  json["layer_types"] = {"full_attention", "chunked", "full_attention", "full_attention"};
  REQUIRE_THROWS_WITH(ModelConfig::from_json(json), Contains("layer_types[1] is \"chunked\""));
}

TEST_CASE("qwen2: sliding layers from use_sliding_window, max_window_layers or layer_types", "[qwen2][config]") {
  auto json = qwen2_json();
  auto d = ModelConfig::from_json(json).decoder;
  CHECK_FALSE(d.sliding_window);  // use_sliding_window defaults to false
  CHECK(d.layer_types == std::vector<std::string>(4, kFullAttention));
  CHECK(d.num_key_value_heads == 2);
  CHECK(d.qkv_bias);
  CHECK_FALSE(d.o_bias);
  json["use_sliding_window"] = true;
  json["sliding_window"] = 3;
  json["max_window_layers"] = 2;
  d = ModelConfig::from_json(json).decoder;
  CHECK(d.sliding_window == 3);
  CHECK(d.layer_types == std::vector<std::string>{kFullAttention, kFullAttention, kSlidingAttention, kSlidingAttention});
  json["layer_types"] = {kSlidingAttention, kFullAttention, kSlidingAttention, kFullAttention};
  CHECK(ModelConfig::from_json(json).decoder.layer_types[0] == kSlidingAttention);
  json.erase("num_key_value_heads");
  json["num_attention_heads"] = 64;
  CHECK(ModelConfig::from_json(json).decoder.num_key_value_heads == 32);  // Qwen2Config's default, not nH
}

TEST_CASE("qwen2: q/k/v biases in the state dict, and cached decoding equals recomputing", "[qwen2][generate]") {
  auto json = qwen2_json();
  json["use_sliding_window"] = true;
  json["sliding_window"] = 3;
  json["max_window_layers"] = 2;
  auto model = construct_model(ModelConfig::from_json(json));
  init_random_weights(*model, 3);
  CHECK(model->class_name() == "Qwen2ForCausalLM");
  REQUIRE(std::dynamic_pointer_cast<qwen2::Qwen2ForCausalLM>(model));
  const auto params = model->named_parameters();
  CHECK(params.contains("model.layers.0.self_attn.q_proj.bias"));
  CHECK(params.contains("model.layers.0.self_attn.v_proj.bias"));
  CHECK_FALSE(params.contains("model.layers.0.self_attn.o_proj.bias"));
  CHECK(model->patch_points()[1].module->patch_record().key == "Qwen2DecoderLayer");

  GenerationConfig config;
  config.max_new_tokens = 8;
  config.output_logits = true;
  const auto out = generate(*model, prompt({3, 1, 4, 1, 5, 9, 2, 6}), {}, config);
  at::NoGradGuard no_grad;
  for (int64_t step = 0; step < 8; ++step) {
    ModelInputs in;
    in.input_ids = out.sequences.narrow(1, 0, 8 + step);
    const auto logits = model->forward(in).logits.select(1, 7 + step);
    CHECK(testutil::close("qwen2 step " + std::to_string(step), logits, out.logits[step], {}, 1e-4, 1e-4));
  }
  // The window matters: without it the same weights give other logits.
  auto full_json = json;
  full_json["use_sliding_window"] = false;
  auto full = construct_model(ModelConfig::from_json(full_json));
  {
    at::NoGradGuard guard;
    for (auto& p : full->named_parameters()) p.value().copy_(params[p.key()]);
  }
  ModelInputs in;
  in.input_ids = out.sequences;
  const double diff = testutil::max_abs_diff(full->forward(in).logits, model->forward(in).logits);
  std::cout << "qwen2 without its window: max abs diff = " << diff << "\n";
  CHECK(diff > 1e-3);
}
