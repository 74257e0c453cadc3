// Granite: Llama's blocks scaled by four multipliers: the embeddings by `embedding_multiplier`, each
// block's output by `residual_multiplier` before it joins the residual stream, attention scores by
// `attention_multiplier` (instead of head_dim ** -0.5), and the logits divided by `logits_scaling`.
#include <cmath>

#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/models/decoder_family.h"
#include "torchpatch/printable.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch::granite {

namespace {

const DecoderSpec& spec() {
  static const DecoderSpec spec{"GraniteAttention",    "GraniteMLP",   "GraniteRMSNorm",
                                "GraniteDecoderLayer", "GraniteModel", "GraniteForCausalLM"};
  return spec;
}

/// GraniteConfig's own fields.
struct GraniteConfig : FamilyFields {
  double embedding_multiplier = 1.0;
  double residual_multiplier = 1.0;
  double attention_multiplier = 1.0;
  double logits_scaling = 1.0;
  void to_json(nlohmann::json& j) const override {
    j["embedding_multiplier"] = embedding_multiplier;
    j["residual_multiplier"] = residual_multiplier;
    j["attention_multiplier"] = attention_multiplier;
    j["logits_scaling"] = logits_scaling;
  }
};

const GraniteConfig& granite(const BuildContext& ctx) { return model_config(ctx).family_fields<GraniteConfig>(); }

nn::GqaOptions granite_attention_options(const ModelConfig& config) {
  auto options = attention_options(config.decoder);
  options.scaling = config.family_fields<GraniteConfig>().attention_multiplier;
  return options;
}

class GraniteAttention : public nn::GqaAttention {
 public:
  explicit GraniteAttention(const BuildContext& ctx) : GqaAttention(granite_attention_options(model_config(ctx))) {}
};

class GraniteMLP : public nn::GatedMlp {
 public:
  explicit GraniteMLP(const BuildContext& ctx) : GatedMlp(mlp_options(ctx)) {}
};

class GraniteRMSNorm : public nn::RmsNorm {
 public:
  explicit GraniteRMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps) {}
};

class GraniteDecoderLayer : public PreNormDecoderLayer {
 public:
  explicit GraniteDecoderLayer(const BuildContext& ctx)
      : PreNormDecoderLayer(ctx, spec()), residual_(granite(ctx).residual_multiplier) {}

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const AttentionInputs& inputs) override {
    auto h = hidden + self_attn->forward(input_layernorm->forward(hidden), inputs) * residual_;
    return h + mlp->forward(post_attention_layernorm->forward(h)) * residual_;
  }

 private:
  double residual_;
};

class GraniteModel : public DecoderModel {
 public:
  explicit GraniteModel(const BuildContext& ctx) : DecoderModel(ctx, spec()), scale_(granite(ctx).embedding_multiplier) {}

 protected:
  at::Tensor embed(const at::Tensor& ids) override { return DecoderModel::embed(ids) * scale_; }

 private:
  double scale_;
};

class GraniteForCausalLM : public DecoderForCausalLM {
 public:
  explicit GraniteForCausalLM(const BuildContext& ctx)
      : DecoderForCausalLM(ctx, spec()), scaling_(granite(ctx).logits_scaling) {}

 protected:
  at::Tensor logits(const at::Tensor& hidden) override { return lm_head->forward(hidden) / scaling_; }

 private:
  double scaling_;
};

// config.json of a "granite" file as llama.cpp runs it: the four multipliers are its attention.scale,
// embedding_scale, residual_scale and logit_scale, where an absent or zero scale means none (and for
// attention, head_dim ** -0.5, as a Llama's).
nlohmann::json gguf_config(const GgufMetadata& m) {
  auto c = gguf_decoder_config(m, "granite", "GraniteForCausalLM");
  if (m.boolean_or("rope.scaling.finetuned") == false) {
    m.fail(m.full("rope.scaling.finetuned"),
           "false: llama.cpp's granite then runs without RoPE, which Granite does not");
  }
  const auto heads = c["num_attention_heads"].get<int64_t>();
  if (heads <= 0) m.fail(m.full("attention.head_count"), fmt::format("{}, not a positive head count", heads));
  const auto head_dim = c.value("head_dim", c["hidden_size"].get<int64_t>() / heads);
  const auto scale = [&](const char* key, double none) {
    const auto v = m.number_or(key);
    return v && *v != 0 ? *v : none;
  };
  c["attention_multiplier"] = scale("attention.scale", 1.0 / std::sqrt(static_cast<double>(head_dim)));
  c["embedding_multiplier"] = scale("embedding_scale", 1.0);
  c["residual_multiplier"] = scale("residual_scale", 1.0);
  c["logits_scaling"] = m.number("logit_scale");  // llama.cpp requires it
  return c;
}

// The four multipliers, always written: llama.cpp's defaults for absent keys are not Granite's.
std::vector<std::pair<std::string, checkpoint::GgufValue>> gguf_metadata(const nlohmann::json& c) {
  auto m = gguf_decoder_metadata("granite", c);
  for (const auto& [field, key] : {std::pair{"attention_multiplier", "granite.attention.scale"},
                                   std::pair{"embedding_multiplier", "granite.embedding_scale"},
                                   std::pair{"residual_multiplier", "granite.residual_scale"},
                                   std::pair{"logits_scaling", "granite.logit_scale"}}) {
    m.emplace_back(key, checkpoint::GgufValue::of(static_cast<float>(c.value(field, 1.0))));
  }
  return m;
}

// Llama's tensors, q and k rows permuted as llama.cpp's Llama converter (Granite's derives from it).
GgufArchitecture gguf_architecture() {
  GgufArchitecture a;
  a.names = {"granite"};
  a.config = gguf_config;
  a.tensors = gguf_decoder_tensor_names(/*permuted_qk=*/true);
  a.metadata = gguf_metadata;
  return a;
}

}  // namespace

Family family() {
  DecoderTraits traits;  // GraniteConfig defaults
  auto& d = traits.defaults;
  d.vocab_size = 32000;
  d.hidden_size = 4096;
  d.intermediate_size = 11008;
  d.num_hidden_layers = 32;
  d.num_attention_heads = 32;
  d.num_key_value_heads = 0;  // None: as many as attention heads
  d.max_position_embeddings = 2048;
  d.rms_norm_eps = 1e-6;
  auto family = decoder_family<GraniteAttention, GraniteMLP, GraniteRMSNorm, GraniteDecoderLayer, GraniteModel,
                               GraniteForCausalLM>("granite", spec(), traits);
  family.parse_config = [traits](const nlohmann::json& j, const std::string& source) {
    auto config = parse_decoder_config(j, source, traits);
    ConfigReader f(j, source);
    auto own = std::make_shared<GraniteConfig>();
    for (auto [field, key] : {std::pair{&own->embedding_multiplier, "embedding_multiplier"},
                              std::pair{&own->residual_multiplier, "residual_multiplier"},
                              std::pair{&own->attention_multiplier, "attention_multiplier"},
                              std::pair{&own->logits_scaling, "logits_scaling"}}) {
      *field = f.number(key, *field);
      if (!(*field > 0) || !std::isfinite(*field)) f.fail(fmt::format("field '{}' must be a positive number", key));
    }
    config.fields = std::move(own);
    return config;
  };
  family.attention_options = granite_attention_options;
  auto tiny = tiny_decoder_preset("granite", "GraniteForCausalLM");
  tiny.update({{"embedding_multiplier", 12.0}, {"residual_multiplier", 0.22}, {"attention_multiplier", 0.0625},
               {"logits_scaling", 8.0}});
  family.presets = {{"tiny-granite", tiny}};
  family.gguf = gguf_architecture();
  return family;
}

}  // namespace torchpatch::granite
