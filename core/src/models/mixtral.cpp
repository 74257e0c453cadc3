// Mixtral: Mistral's attention with a sparse block in every layer: softmax routing over
// num_local_experts experts, the chosen top-k renormalised, no shared expert. Each expert is as wide
// as intermediate_size. The hub keeps the block as `block_sparse_moe` and an expert's projections as
// w1 (gate), w3 (up) and w2 (down): its experts layout, which the conversions read.
#include "torchpatch/models/decoder_family.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch::mixtral {

namespace {

const DecoderSpec& spec() {
  static const DecoderSpec spec{"MixtralAttention",      "",                  "MixtralRMSNorm",
                                "MixtralDecoderLayer",   "MixtralModel",      "MixtralForCausalLM",
                                "MixtralSparseMoeBlock", "MixtralTopKRouter", "MixtralExperts",
                                "",                      ExpertsLayout{"block_sparse_moe", "w1", "w3", "w2"}};
  return spec;
}

class MixtralAttention : public nn::GqaAttention {
 public:
  explicit MixtralAttention(const BuildContext& ctx) : GqaAttention(attention_options(model_config(ctx).decoder)) {}
};

class MixtralRMSNorm : public nn::RmsNorm {
 public:
  explicit MixtralRMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps) {}
};

class MixtralTopKRouter : public nn::TopKRouter {
 public:
  explicit MixtralTopKRouter(const BuildContext& ctx) : TopKRouter(router_options(model_config(ctx).decoder)) {}
};

class MixtralExperts : public nn::FusedExperts {
 public:
  explicit MixtralExperts(const BuildContext& ctx) : FusedExperts(experts_options(model_config(ctx).decoder)) {}
};

class MixtralSparseMoeBlock : public SparseMoeBlock {
 public:
  explicit MixtralSparseMoeBlock(const BuildContext& ctx) : SparseMoeBlock(ctx, spec()) {}
};

class MixtralDecoderLayer : public PreNormDecoderLayer {
 public:
  explicit MixtralDecoderLayer(const BuildContext& ctx) : PreNormDecoderLayer(ctx, spec()) {}
};

class MixtralModel : public DecoderModel {
 public:
  explicit MixtralModel(const BuildContext& ctx) : DecoderModel(ctx, spec()) {}
};

class MixtralForCausalLM : public DecoderForCausalLM {
 public:
  explicit MixtralForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}
};

}  // namespace

Family family() {
  DecoderTraits traits;  // MixtralConfig defaults
  auto& d = traits.defaults;
  d.vocab_size = 32000;
  d.hidden_size = 4096;
  d.intermediate_size = 14336;
  d.num_hidden_layers = 32;
  d.num_attention_heads = 32;
  d.num_key_value_heads = 8;
  d.max_position_embeddings = 4096 * 32;
  d.rms_norm_eps = 1e-5;
  d.moe.num_experts = 8;
  d.moe.num_experts_per_tok = 2;
  d.moe.norm_topk_prob = true;  // Mixtral always renormalises the chosen experts' weights
  traits.sliding = DecoderTraits::SlidingLayers::kAll;
  traits.biases = DecoderTraits::Biases::kNone;
  traits.moe = true;
  traits.expert_width_field = "intermediate_size";
  auto family = decoder_family<MixtralAttention, void, MixtralRMSNorm, MixtralDecoderLayer, MixtralModel,
                               MixtralForCausalLM>("mixtral", spec(), traits);
  add_moe_parts<MixtralSparseMoeBlock, MixtralTopKRouter, MixtralExperts>(family, spec());
  auto tiny = tiny_decoder_preset("mixtral", "MixtralForCausalLM");
  tiny.update({{"num_local_experts", 4}, {"num_experts_per_tok", 2}, {"rms_norm_eps", 1e-6}, {"rope_theta", 1e6}});
  family.presets = {{"tiny-mixtral", tiny}};
  return family;
}

}  // namespace torchpatch::mixtral
