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

// -- llama.cpp's "gpt-oss" files ---------------------------------------------------------------------
//
// Its converter splits the fused experts: gate_up_proj [E, H, 2I] (gate and up interleaved by column)
// into ffn_gate_exps and ffn_up_exps [E, I, H], down_proj [E, I, H] transposed into ffn_down_exps,
// and their biases likewise; the sinks are attn_sinks. Released files hold the experts as MXFP4,
// which torchpatch does not read yet (a file of float experts, as the converter writes from a float
// checkpoint, loads).

nlohmann::json gguf_config(const GgufMetadata& m) {
  auto c = gguf_decoder_config(m, "gpt_oss", "GptOssForCausalLM");
  const auto layers = c["num_hidden_layers"].get<int64_t>();
  c["num_local_experts"] = m.integer("expert_count");
  c["num_experts_per_tok"] = m.integer("expert_used_count");
  c["intermediate_size"] = m.integer("expert_feed_forward_length");
  c["head_dim"] = m.integer("attention.key_length");
  c["attention_bias"] = true;
  c["sliding_window"] = m.integer("attention.sliding_window");
  c["layer_types"] = gguf_layer_types(m, layers, 2);  // llama.cpp's default: every other layer slides
  // GPT-OSS's YaRN keeps the correction range unrounded; the file has no key for it.
  if (c.contains("rope_scaling")) c["rope_scaling"]["truncate"] = false;
  return c;
}

std::vector<std::pair<std::string, checkpoint::GgufValue>> gguf_metadata(const nlohmann::json& c) {
  auto hub = c;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (hub.contains(key) && hub[key].is_object()) hub[key].erase("truncate");  // what llama.cpp's gpt-oss assumes
  }
  const auto u32 = [](int64_t v) { return checkpoint::GgufValue::of(static_cast<uint32_t>(v)); };
  auto m = gguf_decoder_metadata("gpt-oss", hub);
  m.emplace_back("gpt-oss.expert_count", u32(c.value("num_local_experts", int64_t{0})));
  m.emplace_back("gpt-oss.expert_used_count", u32(c.value("num_experts_per_tok", int64_t{0})));
  m.emplace_back("gpt-oss.expert_feed_forward_length", u32(c.value("intermediate_size", int64_t{0})));
  m.emplace_back("gpt-oss.attention.sliding_window", u32(c.value("sliding_window", int64_t{0})));
  if (const auto pattern = c.contains("layer_types") && c["layer_types"].is_array()
                               ? gguf_sliding_pattern(c["layer_types"].get<std::vector<std::string>>(), 2)
                               : std::nullopt) {
    m.emplace_back("gpt-oss.attention.sliding_window_pattern", *pattern);
  }
  return m;
}

GgufArchitecture gguf_architecture() {
  using T = GgufTensorTransform;
  GgufArchitecture a;
  a.names = {"gpt-oss"};
  a.config = gguf_config;
  for (auto& n : gguf_decoder_tensor_names(/*permuted_qk=*/false)) {
    if (n.hub.find(".mlp.") != std::string::npos) continue;  // its experts, below
    if (n.gguf == "blk.{}.ffn_norm.weight") n.gguf = "blk.{}.post_attention_norm.weight";
    a.tensors.push_back(std::move(n));
  }
  const std::string mlp = "model.layers.{}.mlp.";
  a.tensors.push_back({"blk.{}.attn_sinks.weight", "model.layers.{}.self_attn.sinks"});
  a.tensors.push_back({"blk.{}.ffn_gate_inp.weight", mlp + "router.weight"});
  a.tensors.push_back({"blk.{}.ffn_gate_inp.bias", mlp + "router.bias"});
  a.tensors.push_back({"blk.{}.ffn_gate_exps.weight", mlp + "experts.gate_up_proj", T::kJoinInterleavedTransposed, false,
                       "blk.{}.ffn_up_exps.weight"});
  a.tensors.push_back({"blk.{}.ffn_gate_exps.bias", mlp + "experts.gate_up_proj_bias", T::kJoinInterleaved, false,
                       "blk.{}.ffn_up_exps.bias"});
  a.tensors.push_back({"blk.{}.ffn_down_exps.weight", mlp + "experts.down_proj", T::kTransposeStacked});
  a.tensors.push_back({"blk.{}.ffn_down_exps.bias", mlp + "experts.down_proj_bias"});
  a.metadata = gguf_metadata;
  return a;
}

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
  family.gguf = gguf_architecture();
  return family;
}

}  // namespace torchpatch::gpt_oss
