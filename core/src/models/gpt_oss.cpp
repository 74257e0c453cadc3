// GPT-OSS: grouped-query attention with biases and a learned "sink" logit per head (a column every
// query's softmax also sees, then drops), sliding and full layers alternating (`layer_types`), yarn
// RoPE; every layer sparse, routed by the k largest logits of a router with a bias, softmaxed over
// those k; experts with biases, held fused as the hub has them (gate_up_proj [E, H, 2I] with gate and
// up interleaved, down_proj [E, I, H]), and a clamped SwiGLU: (up + 1) * gate * sigmoid(1.702 gate),
// gate clamped above and up on both sides at `swiglu_limit`.
#include <fmt/format.h>

#include <cmath>

#include <ATen/ATen.h>

#include "torchpatch/error.h"
#include "torchpatch/models/decoder_family.h"
#include "torchpatch/nn/rms_norm.h"
#include "torchpatch/nn/rotary.h"

namespace torchpatch::gpt_oss {

namespace {

/// Its attention's kind: the sinks are not a block the tensor-parallel plugin splits yet.
constexpr const char* kSinkAttention = "sink_attention";

const DecoderSpec& spec() {
  static const DecoderSpec spec{"GptOssAttention", "",
                                "GptOssRMSNorm",   "GptOssDecoderLayer",
                                "GptOssModel",     "GptOssForCausalLM",
                                "GptOssMLP",       "GptOssTopKRouter",
                                "GptOssExperts",   "",
                                ExpertsLayout{"mlp", "gate_proj", "up_proj", "down_proj", "shared_expert", true, "router"}};
  return spec;
}

class GptOssAttention : public nn::GqaAttention {
 public:
  explicit GptOssAttention(const BuildContext& ctx) : GqaAttention(attention_options(model_config(ctx).decoder)) {
    sinks = register_parameter("sinks", at::zeros({num_heads}));
  }

  at::Tensor sinks;  ///< [nH]: each head's sink logit

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const AttentionInputs& inputs) override {
    const auto b = hidden.size(0), len = hidden.size(1);
    auto query = q_proj->forward(hidden).view({b, len, num_heads, head_dim}).transpose(1, 2);  // [B, nH, Q, hd]
    auto key = k_proj->forward(hidden).view({b, len, num_key_value_heads, head_dim}).transpose(1, 2);
    auto value = v_proj->forward(hidden).view({b, len, num_key_value_heads, head_dim}).transpose(1, 2);
    query = nn::apply_rotary(query, inputs.cos, inputs.sin);
    key = nn::apply_rotary(key, inputs.cos, inputs.sin);
    if (inputs.cache) std::tie(key, value) = inputs.cache->update(key, value, inputs.layer_idx);
    const auto groups = num_heads / num_key_value_heads;
    key = key.repeat_interleave(groups, 1);
    value = value.repeat_interleave(groups, 1);
    auto scores = at::matmul(query, key.transpose(2, 3)) * scaling;  // [B, nH, Q, KV]
    if (inputs.mask.defined()) scores = scores + inputs.mask;
    const auto sink = sinks.to(scores.scalar_type()).view({1, -1, 1, 1}).expand({b, num_heads, len, 1});
    auto combined = at::cat({scores, sink}, -1);
    combined = combined - std::get<0>(combined.max(-1, /*keepdim=*/true));
    const auto probs = at::softmax(combined, -1).narrow(-1, 0, scores.size(-1));
    if (inputs.weights_out) *inputs.weights_out = probs;
    const auto out = at::matmul(probs, value).transpose(1, 2).reshape({b, len, num_heads * head_dim});
    return o_proj->forward(out);
  }
};

class GptOssRMSNorm : public nn::RmsNorm {
 public:
  explicit GptOssRMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps) {}
};

class GptOssTopKRouter : public nn::SoftmaxOfTopKRouter {
 public:
  explicit GptOssTopKRouter(const BuildContext& ctx) : SoftmaxOfTopKRouter(router_options(model_config(ctx).decoder)) {}
};

class GptOssExperts : public nn::ClampedSwigluExperts {
 public:
  explicit GptOssExperts(const BuildContext& ctx)
      : ClampedSwigluExperts(clamped_swiglu_experts_options(model_config(ctx).decoder)) {}
};

class GptOssMLP : public SparseMoeBlock {
 public:
  explicit GptOssMLP(const BuildContext& ctx) : SparseMoeBlock(ctx, spec()) {}
};

class GptOssDecoderLayer : public PreNormDecoderLayer {
 public:
  explicit GptOssDecoderLayer(const BuildContext& ctx) : PreNormDecoderLayer(ctx, spec()) {}
};

class GptOssModel : public DecoderModel {
 public:
  explicit GptOssModel(const BuildContext& ctx) : DecoderModel(ctx, spec()) {}
};

class GptOssForCausalLM : public DecoderForCausalLM {
 public:
  explicit GptOssForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}
};

}  // namespace

Family family() {
  DecoderTraits traits;  // GptOssConfig defaults
  auto& d = traits.defaults;
  d.vocab_size = 201088;
  d.hidden_size = 2880;
  d.intermediate_size = 2880;
  d.num_hidden_layers = 36;
  d.num_attention_heads = 64;
  d.num_key_value_heads = 8;
  d.head_dim = 64;
  d.max_position_embeddings = 131072;
  d.rms_norm_eps = 1e-5;
  d.attention_bias = true;
  d.sliding_window = 128;
  d.moe.num_experts = 128;
  d.moe.num_experts_per_tok = 4;
  d.moe.router_aux_loss_coef = 0.9;
  traits.fixed_head_dim = true;
  traits.sliding = DecoderTraits::SlidingLayers::kPattern;
  traits.sliding_window_pattern = 2;  // sliding, full, sliding, ...
  traits.moe = true;
  traits.expert_width_field = "intermediate_size";
  auto family = decoder_family<GptOssAttention, void, GptOssRMSNorm, GptOssDecoderLayer, GptOssModel, GptOssForCausalLM>(
      "gpt_oss", spec(), traits);
  // Its experts hold the hub's own fused layout: no per-expert conversion.
  add_moe_parts<GptOssMLP, GptOssTopKRouter, GptOssExperts>(family, spec());
  family.conversions = nullptr;
  for (auto& point : family.patch_points) {
    if (point.name == spec().attention) point.kind = kSinkAttention;
  }
  family.parse_config = [traits](const nlohmann::json& j, const std::string& source) {
    auto config = parse_decoder_config(j, source, traits);
    ConfigReader f(j, source);
    auto& limit = config.decoder.moe.swiglu_limit;
    limit = f.number("swiglu_limit", limit);
    if (!(limit > 0) || !std::isfinite(limit)) f.fail("field 'swiglu_limit' must be a positive number");
    return config;
  };
  auto tiny = tiny_decoder_preset("gpt_oss", "GptOssForCausalLM");
  tiny.update({{"head_dim", 16}, {"intermediate_size", 32}, {"num_local_experts", 4}, {"num_experts_per_tok", 2},
               {"sliding_window", 8}, {"attention_bias", true}});
  family.presets = {{"tiny-gpt-oss", tiny}};
  return family;
}

}  // namespace torchpatch::gpt_oss
