// GLM-4.5 (and 4.6, 4.7): grouped-query attention with q/k/v biases (`attention_bias`; o never),
// per-head q/k RMSNorm when `use_qk_norm`, RoPE over part of each head (`partial_rotary_factor`);
// dense layers below `first_k_dense_replace`, then sparse blocks with the DeepSeek-style router
// (sigmoid scores, e_score_correction_bias steering the choice, groups, routed_scaling_factor) and
// `n_shared_experts` shared experts added ungated.
#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/models/decoder_family.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch::glm4_moe {

namespace {

const DecoderSpec& spec() {
  static const DecoderSpec spec{"Glm4MoeAttention", "Glm4MoeMLP",         "Glm4MoeRMSNorm", "Glm4MoeDecoderLayer",
                                "Glm4MoeModel",     "Glm4MoeForCausalLM", "Glm4MoeMoE",     "Glm4MoeTopkRouter",
                                "Glm4MoeExperts",   "Glm4MoeMLP",
                                ExpertsLayout{"mlp", "gate_proj", "up_proj", "down_proj", "shared_experts", false}};
  return spec;
}

nn::QkNormOptions glm4_qk_norm(const ModelConfig& config) {
  nn::QkNormOptions norm;
  norm.eps = config.decoder.rms_norm_eps;
  norm.enabled = config.decoder.qk_norm;
  return norm;
}

class Glm4MoeAttention : public nn::QkNormAttention {
 public:
  explicit Glm4MoeAttention(const BuildContext& ctx)
      : QkNormAttention(attention_options(model_config(ctx).decoder), glm4_qk_norm(model_config(ctx))) {}
};

class Glm4MoeMLP : public nn::GatedMlp {
 public:
  explicit Glm4MoeMLP(const BuildContext& ctx) : GatedMlp(mlp_options(ctx)) {}
};

class Glm4MoeRMSNorm : public nn::RmsNorm {
 public:
  explicit Glm4MoeRMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps) {}
};

class Glm4MoeTopkRouter : public nn::GroupedTopKRouter {
 public:
  explicit Glm4MoeTopkRouter(const BuildContext& ctx) : GroupedTopKRouter(grouped_router_options(model_config(ctx).decoder)) {}
};

class Glm4MoeExperts : public nn::FusedExperts {
 public:
  explicit Glm4MoeExperts(const BuildContext& ctx) : FusedExperts(experts_options(model_config(ctx).decoder)) {}
};

class Glm4MoeMoE : public SparseMoeBlock {
 public:
  explicit Glm4MoeMoE(const BuildContext& ctx) : SparseMoeBlock(ctx, spec()) {}
};

class Glm4MoeDecoderLayer : public PreNormDecoderLayer {
 public:
  explicit Glm4MoeDecoderLayer(const BuildContext& ctx) : PreNormDecoderLayer(ctx, spec()) {}
};

class Glm4MoeModel : public DecoderModel {
 public:
  explicit Glm4MoeModel(const BuildContext& ctx) : DecoderModel(ctx, spec()) {}
};

class Glm4MoeForCausalLM : public DecoderForCausalLM {
 public:
  explicit Glm4MoeForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}
};

// llama.cpp's gating function numbers (LLAMA_EXPERT_GATING_FUNC_TYPE_*): GLM-4.5's router is sigmoid.
constexpr int64_t kSigmoidGating = 2;

// A "glm4moe" file as llama.cpp's converter writes it. block_count counts the next-token (MTP) layers
// (nextn_predict_layers) after the model's own, which llama.cpp's main graph does not run and the hub
// model does not have: num_hidden_layers leaves them out.
nlohmann::json gguf_config(const GgufMetadata& m) {
  auto c = gguf_decoder_config(m, "glm4_moe", "Glm4MoeForCausalLM");
  const auto nextn = m.integer_or("nextn_predict_layers").value_or(0);
  const auto layers = c["num_hidden_layers"].get<int64_t>() - nextn;
  if (nextn < 0 || layers <= 0) {
    m.fail(m.full("nextn_predict_layers"), fmt::format("{} of block_count {} leaves no layer of the model", nextn,
                                                       c["num_hidden_layers"].get<int64_t>()));
  }
  c["num_hidden_layers"] = layers;
  c["num_nextn_predict_layers"] = nextn;
  const auto head_dim = m.integer_or("attention.key_length")
                            .value_or(c["hidden_size"].get<int64_t>() / c["num_attention_heads"].get<int64_t>());
  c["head_dim"] = head_dim;  // always: Glm4MoeConfig's default is 128, not hidden / heads
  const auto rotary = m.integer_or("rope.dimension_count").value_or(head_dim);
  c["partial_rotary_factor"] = static_cast<double>(rotary) / static_cast<double>(head_dim);
  if (const auto gating = m.integer_or("expert_gating_func"); gating && *gating != kSigmoidGating) {
    m.fail(m.full("expert_gating_func"), fmt::format("{}, where GLM-4.5's router is sigmoid ({})", *gating, kSigmoidGating));
  }
  gguf_grouped_moe_config(m, c);
  // No keys say these: the tensors do, as llama.cpp loads them where present.
  c["attention_bias"] = m.file().find("blk.0.attn_q.bias") != nullptr;
  c["use_qk_norm"] = m.file().find("blk.0.attn_q_norm.weight") != nullptr;
  return c;
}

// The inverse, as the converter writes it: the MoE keys, the rotary part of each head, and the MTP
// layers counted in block_count (the hub model has none of their tensors; neither has the file then).
std::vector<std::pair<std::string, checkpoint::GgufValue>> gguf_metadata(const nlohmann::json& c,
                                                                        const ModelConfig& config) {
  using checkpoint::GgufValue;
  const std::string source = "glm4_moe as GGUF architecture 'glm4moe'";
  const auto nextn_field = c.value("num_nextn_predict_layers", nlohmann::json(0));
  const auto nextn = nextn_field.is_number_integer() ? nextn_field.get<int64_t>() : 0;
  const auto head_dim = c.at("head_dim").get<int64_t>();
  const auto rotary = static_cast<int64_t>(head_dim * config.decoder.rope.partial_rotary_factor);
  auto m = gguf_decoder_metadata("glm4moe", c);
  for (auto& [key, value] : m) {
    if (key == "glm4moe.block_count") value = GgufValue::of(static_cast<uint32_t>(config.decoder.num_hidden_layers + nextn));
    if (key == "glm4moe.rope.dimension_count") value = GgufValue::of(static_cast<uint32_t>(rotary));
  }
  for (auto& key : gguf_grouped_moe_metadata("glm4moe", config.decoder.moe, source)) m.push_back(std::move(key));
  if (nextn > 0) m.emplace_back("glm4moe.nextn_predict_layers", GgufValue::of(static_cast<uint32_t>(nextn)));
  return m;
}

// The usual names unpermuted (GLM's RoPE rotates halves, as llama.cpp's NeoX RoPE), the norm before
// the MLP named post_attention_norm, the experts stacked, the router's bias (exp_probs_b) and the
// shared experts (ffn_*_shexp, one MLP as wide as all of them).
GgufArchitecture gguf_architecture(const std::function<ModelConfig(const nlohmann::json&, const std::string&)>& parse) {
  constexpr bool kProjection = true;
  GgufArchitecture a;
  a.names = {"glm4moe"};
  a.config = gguf_config;
  a.tensors = gguf_decoder_tensor_names(/*permuted_qk=*/false);
  for (auto& n : a.tensors) {
    if (n.gguf == "blk.{}.ffn_norm.weight") n.gguf = "blk.{}.post_attention_norm.weight";
  }
  for (auto& n : gguf_expert_tensor_names()) a.tensors.push_back(std::move(n));
  a.tensors.push_back({"blk.{}.exp_probs_b.bias", "model.layers.{}.mlp.gate.e_score_correction_bias"});
  for (const auto& [gguf, hub] : {std::pair{"gate", "gate_proj"}, std::pair{"up", "up_proj"}, std::pair{"down", "down_proj"}}) {
    a.tensors.push_back({fmt::format("blk.{{}}.ffn_{}_shexp.weight", gguf),
                         fmt::format("model.layers.{{}}.mlp.shared_experts.{}.weight", hub), GgufTensorTransform::kNone,
                         kProjection});
  }
  a.metadata = [parse](const nlohmann::json& c) {
    return gguf_metadata(c, parse(c, "glm4_moe as GGUF architecture 'glm4moe'"));
  };
  return a;
}

}  // namespace

Family family() {
  DecoderTraits traits;  // Glm4MoeConfig defaults
  auto& d = traits.defaults;
  d.vocab_size = 151552;
  d.hidden_size = 4096;
  d.intermediate_size = 10944;
  d.num_hidden_layers = 46;
  d.num_attention_heads = 96;
  d.num_key_value_heads = 8;
  d.head_dim = 128;
  d.max_position_embeddings = 131072;
  d.rms_norm_eps = 1e-5;
  d.moe.num_experts = 128;
  d.moe.num_experts_per_tok = 8;
  d.moe.moe_intermediate_size = 1408;
  d.moe.norm_topk_prob = true;
  d.moe.first_k_dense_replace = 1;
  traits.fixed_head_dim = true;
  traits.biases = DecoderTraits::Biases::kQkvFromConfig;
  traits.moe = true;
  auto family = decoder_family<Glm4MoeAttention, Glm4MoeMLP, Glm4MoeRMSNorm, Glm4MoeDecoderLayer, Glm4MoeModel,
                               Glm4MoeForCausalLM>("glm4_moe", spec(), traits);
  add_moe_parts<Glm4MoeMoE, Glm4MoeTopkRouter, Glm4MoeExperts>(family, spec());
  family.parse_config = [traits](const nlohmann::json& j, const std::string& source) {
    auto config = parse_decoder_config(j, source, traits);
    ConfigReader f(j, source);
    read_shared_experts(f, config.decoder.moe);
    config.decoder.qk_norm = f.boolean("use_qk_norm", false);
    return config;
  };
  family.qk_norm_options = glm4_qk_norm;
  auto tiny = tiny_decoder_preset("glm4_moe", "Glm4MoeForCausalLM");
  tiny.update({{"num_hidden_layers", 3}, {"head_dim", 16}, {"n_routed_experts", 8}, {"num_experts_per_tok", 2},
               {"moe_intermediate_size", 32}, {"n_shared_experts", 1}, {"n_group", 2}, {"topk_group", 1},
               {"first_k_dense_replace", 1}, {"partial_rotary_factor", 0.5}, {"use_qk_norm", true},
               {"attention_bias", true}, {"routed_scaling_factor", 2.5}});
  family.presets = {{"tiny-glm4-moe", tiny}};
  family.gguf = gguf_architecture(family.parse_config);
  return family;
}

}  // namespace torchpatch::glm4_moe
