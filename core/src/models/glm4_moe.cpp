// GLM-4.5 (and 4.6, 4.7): grouped-query attention with q/k/v biases (`attention_bias`; o never),
// per-head q/k RMSNorm when `use_qk_norm`, RoPE over part of each head (`partial_rotary_factor`);
// dense layers below `first_k_dense_replace`, then sparse blocks with the DeepSeek-style router
// (sigmoid scores, e_score_correction_bias steering the choice, groups, routed_scaling_factor) and
// `n_shared_experts` shared experts added ungated.
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
  return family;
}

}  // namespace torchpatch::glm4_moe
