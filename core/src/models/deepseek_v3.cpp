// DeepSeek-V3 (and DeepSeek-R1, Kimi-K2: the same architecture): multi-head latent attention and
// GLM-4.5's MoE (the DeepSeek-style router, ungated shared experts, dense first layers).
//
// Multi-head latent attention: queries through a low-rank bottleneck (q_a_proj, q_a_layernorm,
// q_b_proj; or one q_proj without `q_lora_rank`), keys and values from one compressed vector
// (kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj). Each head's query and key are a part without
// positions (qk_nope_head_dim) and a rotary part (qk_rope_head_dim) that every head's key shares;
// values are v_head_dim wide. With `rope_interleave` the rotary parts are stored pairwise
// interleaved and put in half-split order before RoPE.
#include <cmath>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/models/decoder_family.h"
#include "torchpatch/nn/rms_norm.h"
#include "torchpatch/nn/rotary.h"

namespace torchpatch::deepseek_v3 {

namespace {

/// The kind of its attention: heads do not split like grouped-query heads (`--tp` refuses it).
constexpr const char* kLatentAttention = "latent_attention";

const DecoderSpec& spec() {
  static const DecoderSpec spec{"DeepseekV3Attention", "DeepseekV3MLP",         "DeepseekV3RMSNorm", "DeepseekV3DecoderLayer",
                                "DeepseekV3Model",     "DeepseekV3ForCausalLM", "DeepseekV3MoE",     "DeepseekV3TopkRouter",
                                "DeepseekV3Experts",   "DeepseekV3MLP",
                                ExpertsLayout{"mlp", "gate_proj", "up_proj", "down_proj", "shared_experts", false}};
  return spec;
}

/// DeepseekV3Config's attention fields.
struct DeepseekV3Config : FamilyFields {
  int64_t q_lora_rank = 1536;  ///< 0: no query bottleneck (one q_proj)
  int64_t kv_lora_rank = 512;
  int64_t qk_nope_head_dim = 128;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;
  bool rope_interleave = true;
  double scaling = 0;  ///< qk_head_dim ** -0.5, times yarn's mscale squared
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  void to_json(nlohmann::json& j) const override {
    j["q_lora_rank"] = q_lora_rank > 0 ? nlohmann::json(q_lora_rank) : nlohmann::json();
    j["kv_lora_rank"] = kv_lora_rank;
    j["qk_nope_head_dim"] = qk_nope_head_dim;
    j["qk_rope_head_dim"] = qk_rope_head_dim;
    j["v_head_dim"] = v_head_dim;
    j["rope_interleave"] = rope_interleave;
  }
};

// [B, H, S, d] stored as pairs (x0, y0, x1, y1, ...) -> halves (x0, x1, ..., y0, y1, ...).
at::Tensor deinterleave(const at::Tensor& x) {
  const auto b = x.size(0), h = x.size(1), s = x.size(2), d = x.size(3);
  return x.view({b, h, s, d / 2, 2}).transpose(4, 3).reshape({b, h, s, d});
}

class DeepseekV3Attention : public roles::Attention {
 public:
  explicit DeepseekV3Attention(const BuildContext& ctx)
      : own_(model_config(ctx).family_fields<DeepseekV3Config>()), heads_(model_config(ctx).decoder.num_attention_heads) {
    const auto& d = model_config(ctx).decoder;
    const bool bias = d.attention_bias;
    const int64_t hidden = d.hidden_size;
    if (own_.q_lora_rank > 0) {
      q_a_proj = register_module("q_a_proj", nn::make_linear("q_a_proj", hidden, own_.q_lora_rank, bias));
      q_a_layernorm = register_module("q_a_layernorm", std::make_shared<nn::RmsNorm>(own_.q_lora_rank, d.rms_norm_eps));
      q_b_proj = register_module("q_b_proj", nn::make_linear("q_b_proj", own_.q_lora_rank, heads_ * own_.qk_head_dim(), false));
    } else {
      q_proj = register_module("q_proj", nn::make_linear("q_proj", hidden, heads_ * own_.qk_head_dim(), false));
    }
    kv_a_proj_with_mqa = register_module(
        "kv_a_proj_with_mqa", nn::make_linear("kv_a_proj_with_mqa", hidden, own_.kv_lora_rank + own_.qk_rope_head_dim, bias));
    kv_a_layernorm = register_module("kv_a_layernorm", std::make_shared<nn::RmsNorm>(own_.kv_lora_rank, d.rms_norm_eps));
    kv_b_proj = register_module(
        "kv_b_proj", nn::make_linear("kv_b_proj", own_.kv_lora_rank, heads_ * (own_.qk_nope_head_dim + own_.v_head_dim), false));
    o_proj = register_module("o_proj", nn::make_linear("o_proj", heads_ * own_.v_head_dim, hidden, bias));
  }

  std::shared_ptr<roles::Linear> q_proj, q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj;
  std::shared_ptr<nn::RmsNorm> q_a_layernorm, kv_a_layernorm;

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const AttentionInputs& inputs) override {
    const auto b = hidden.size(0), s = hidden.size(1);
    const auto nope = own_.qk_nope_head_dim, rope = own_.qk_rope_head_dim, lora = own_.kv_lora_rank;
    const auto q_flat = q_proj ? q_proj->forward(hidden) : q_b_proj->forward(q_a_layernorm->forward(q_a_proj->forward(hidden)));
    const auto q = q_flat.view({b, s, heads_, own_.qk_head_dim()}).transpose(1, 2);  // [B, nH, S, nope+rope]
    const auto compressed = kv_a_proj_with_mqa->forward(hidden);                     // [B, S, lora+rope]
    const auto kv = kv_b_proj->forward(kv_a_layernorm->forward(compressed.narrow(-1, 0, lora)))
                        .view({b, s, heads_, nope + own_.v_head_dim})
                        .transpose(1, 2);  // [B, nH, S, nope+v]
    auto q_rot = q.narrow(-1, nope, rope);
    auto k_rot = compressed.narrow(-1, lora, rope).reshape({b, 1, s, rope});  // one rotary key for every head
    if (own_.rope_interleave) {
      q_rot = deinterleave(q_rot);
      k_rot = deinterleave(k_rot);
    }
    q_rot = nn::apply_rotary(q_rot, inputs.cos, inputs.sin);
    k_rot = nn::apply_rotary(k_rot, inputs.cos, inputs.sin).expand({b, heads_, s, rope});
    const auto query = at::cat({q.narrow(-1, 0, nope), q_rot}, -1);
    auto key = at::cat({kv.narrow(-1, 0, nope), k_rot}, -1);
    auto value = kv.narrow(-1, nope, own_.v_head_dim).contiguous();
    if (inputs.cache) std::tie(key, value) = inputs.cache->update(key, value, inputs.layer_idx);
    const auto out = nn::eager_attention(query, key, value, inputs.mask, own_.scaling, inputs.weights_out, true,
                                         std::nullopt);  // [B, S, nH, v]
    return o_proj->forward(out.reshape({b, s, heads_ * own_.v_head_dim}));
  }

 private:
  const DeepseekV3Config& own_;
  int64_t heads_;
};

class DeepseekV3MLP : public nn::GatedMlp {
 public:
  explicit DeepseekV3MLP(const BuildContext& ctx) : GatedMlp(mlp_options(ctx)) {}
};

class DeepseekV3RMSNorm : public nn::RmsNorm {
 public:
  explicit DeepseekV3RMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps) {}
};

class DeepseekV3TopkRouter : public nn::GroupedTopKRouter {
 public:
  explicit DeepseekV3TopkRouter(const BuildContext& ctx)
      : GroupedTopKRouter(grouped_router_options(model_config(ctx).decoder)) {}
};

class DeepseekV3Experts : public nn::FusedExperts {
 public:
  explicit DeepseekV3Experts(const BuildContext& ctx) : FusedExperts(experts_options(model_config(ctx).decoder)) {}
};

class DeepseekV3MoE : public SparseMoeBlock {
 public:
  explicit DeepseekV3MoE(const BuildContext& ctx) : SparseMoeBlock(ctx, spec()) {}
};

class DeepseekV3DecoderLayer : public PreNormDecoderLayer {
 public:
  explicit DeepseekV3DecoderLayer(const BuildContext& ctx) : PreNormDecoderLayer(ctx, spec()) {}
};

class DeepseekV3Model : public DecoderModel {
 public:
  explicit DeepseekV3Model(const BuildContext& ctx) : DecoderModel(ctx, spec()) {}
};

class DeepseekV3ForCausalLM : public DecoderForCausalLM {
 public:
  explicit DeepseekV3ForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}
};

// The attention's own fields; RoPE runs over the rotary part only (head_dim = qk_rope_head_dim).
std::shared_ptr<DeepseekV3Config> read_attention(const ConfigReader& f, DecoderConfig& d) {
  auto own = std::make_shared<DeepseekV3Config>();
  own->q_lora_rank = f.json().contains("q_lora_rank") && f.json().at("q_lora_rank").is_null()
                         ? 0
                         : f.positive("q_lora_rank", own->q_lora_rank);
  own->kv_lora_rank = f.positive("kv_lora_rank", own->kv_lora_rank);
  own->qk_nope_head_dim = f.positive("qk_nope_head_dim", own->qk_nope_head_dim);
  own->qk_rope_head_dim = f.positive("qk_rope_head_dim", own->qk_rope_head_dim);
  own->v_head_dim = f.positive("v_head_dim", own->v_head_dim);
  own->rope_interleave = f.boolean("rope_interleave", own->rope_interleave);
  if (own->qk_rope_head_dim % 2 != 0) f.fail(fmt::format("qk_rope_head_dim {} must be even", own->qk_rope_head_dim));
  if (f.has("qk_head_dim") && f.positive("qk_head_dim", 0) != own->qk_head_dim()) {
    f.fail(fmt::format("qk_head_dim {} is not qk_nope_head_dim {} + qk_rope_head_dim {}", f.positive("qk_head_dim", 0),
                       own->qk_nope_head_dim, own->qk_rope_head_dim));
  }
  d.head_dim = own->qk_rope_head_dim;
  own->scaling = 1.0 / std::sqrt(static_cast<double>(own->qk_head_dim()));
  const auto& rope = d.rope;
  if (rope.kind != nn::RopeKind::kDefault && rope.mscale_all_dim && *rope.mscale_all_dim > 0 && rope.factor > 1) {
    const double mscale = 0.1 * *rope.mscale_all_dim * std::log(rope.factor) + 1.0;
    own->scaling *= mscale * mscale;
  }
  return own;
}

// -- llama.cpp's "deepseek2" files ---------------------------------------------------------------------
//
// Its converter writes multi-head latent attention as the multi-query attention its graph runs (one
// key/value head of kv_lora_rank + qk_rope_head_dim: head_count_kv 1, key_length and value_length of
// that form) and gives the per-head sizes as key_length_mla / value_length_mla; kv_b_proj is split in
// attn_k_b and attn_v_b (older files hold attn_kv_b whole). The router's scoring is
// expert_gating_func: without it llama.cpp runs softmax (DeepSeek-V2's).

constexpr int64_t kSigmoidGating = 2;  // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID

nlohmann::json gguf_config(const GgufMetadata& m) {
  auto c = gguf_decoder_config(m, "deepseek_v3", "DeepseekV3ForCausalLM");
  const auto gating = m.integer_or("expert_gating_func");
  if (gating != kSigmoidGating) {
    m.fail(m.full("expert_gating_func"),
           gating ? fmt::format("{}, where DeepSeek-V3's router is sigmoid ({})", *gating, kSigmoidGating)
                  : std::string("missing: llama.cpp then scores experts with softmax (DeepSeek-V2's router), which "
                                "torchpatch's DeepSeek-V3 does not run; a DeepSeek-V3 file says 2 (sigmoid)"));
  }
  c["num_key_value_heads"] = c["num_attention_heads"];  // MLA's heads, not the file's multi-query form
  const auto rope = m.integer("rope.dimension_count");
  c["qk_rope_head_dim"] = rope;
  c["head_dim"] = rope;
  c["qk_nope_head_dim"] = m.integer_or("attention.key_length_mla").value_or(m.integer("attention.key_length")) - rope;
  c["v_head_dim"] = m.integer_or("attention.value_length_mla").value_or(m.integer("attention.value_length"));
  c["kv_lora_rank"] = m.integer("attention.kv_lora_rank");
  const auto q_lora = m.integer_or("attention.q_lora_rank");
  c["q_lora_rank"] = q_lora ? nlohmann::json(*q_lora) : nlohmann::json();
  c["rope_interleave"] = true;  // llama.cpp's deepseek2 rotates interleaved pairs, as the hub layout stores them
  gguf_grouped_moe_config(m, c);
  return c;
}

std::vector<std::pair<std::string, checkpoint::GgufValue>> gguf_metadata(const nlohmann::json& c, const ModelConfig& config) {
  using checkpoint::GgufValue;
  const std::string source = "deepseek_v3 as GGUF architecture 'deepseek2'";
  const auto& own = config.family_fields<DeepseekV3Config>();
  if (!own.rope_interleave) {
    throw ConfigError(source + ": rope_interleave false (llama.cpp's deepseek2 rotates interleaved pairs)");
  }
  const auto u32 = [](int64_t v) { return GgufValue::of(static_cast<uint32_t>(v)); };
  auto m = gguf_decoder_metadata("deepseek2", c);
  for (auto& [key, value] : m) {
    if (key == "deepseek2.attention.head_count_kv") value = u32(1);
    if (key == "deepseek2.attention.key_length") value = u32(own.kv_lora_rank + own.qk_rope_head_dim);
    if (key == "deepseek2.attention.value_length") value = u32(own.kv_lora_rank);
    if (key == "deepseek2.rope.dimension_count") value = u32(own.qk_rope_head_dim);
  }
  if (own.q_lora_rank > 0) m.emplace_back("deepseek2.attention.q_lora_rank", u32(own.q_lora_rank));
  m.emplace_back("deepseek2.attention.kv_lora_rank", u32(own.kv_lora_rank));
  m.emplace_back("deepseek2.attention.key_length_mla", u32(own.qk_head_dim()));
  m.emplace_back("deepseek2.attention.value_length_mla", u32(own.v_head_dim));
  for (auto& key : gguf_grouped_moe_metadata("deepseek2", config.decoder.moe, source)) m.push_back(std::move(key));
  return m;
}

GgufArchitecture gguf_architecture(const std::function<ModelConfig(const nlohmann::json&, const std::string&)>& parse) {
  using T = GgufTensorTransform;
  constexpr bool kProjection = true;
  GgufArchitecture a;
  a.names = {"deepseek2"};
  a.config = gguf_config;
  for (auto& n : gguf_decoder_tensor_names(/*permuted_qk=*/false)) {
    if (n.hub.find(".self_attn.") == std::string::npos) a.tensors.push_back(std::move(n));  // MLA's below
  }
  const std::string attn = "model.layers.{}.self_attn.";
  a.tensors.push_back({"blk.{}.attn_q_a.weight", attn + "q_a_proj.weight", T::kNone, kProjection});
  a.tensors.push_back({"blk.{}.attn_q_a_norm.weight", attn + "q_a_layernorm.weight"});
  a.tensors.push_back({"blk.{}.attn_q_b.weight", attn + "q_b_proj.weight", T::kNone, kProjection});
  a.tensors.push_back({"blk.{}.attn_q.weight", attn + "q_proj.weight", T::kNone, kProjection});
  a.tensors.push_back({"blk.{}.attn_kv_a_mqa.weight", attn + "kv_a_proj_with_mqa.weight", T::kNone, kProjection});
  a.tensors.push_back({"blk.{}.attn_kv_a_norm.weight", attn + "kv_a_layernorm.weight"});
  // Saving writes the split form (the first rule for kv_b_proj), as the converter does now.
  a.tensors.push_back({"blk.{}.attn_k_b.weight", attn + "kv_b_proj.weight", T::kJoinMlaKvB, false, "blk.{}.attn_v_b.weight"});
  a.tensors.push_back({"blk.{}.attn_kv_b.weight", attn + "kv_b_proj.weight", T::kNone, kProjection});
  a.tensors.push_back({"blk.{}.attn_output.weight", attn + "o_proj.weight", T::kNone, kProjection});
  for (auto& n : gguf_expert_tensor_names()) a.tensors.push_back(std::move(n));
  a.tensors.push_back({"blk.{}.exp_probs_b.bias", "model.layers.{}.mlp.gate.e_score_correction_bias"});
  for (const auto& [gguf, hub] : {std::pair{"gate", "gate_proj"}, std::pair{"up", "up_proj"}, std::pair{"down", "down_proj"}}) {
    a.tensors.push_back({fmt::format("blk.{{}}.ffn_{}_shexp.weight", gguf),
                         fmt::format("model.layers.{{}}.mlp.shared_experts.{}.weight", hub), T::kNone, kProjection});
  }
  a.metadata = [parse](const nlohmann::json& c) {
    return gguf_metadata(c, parse(c, "deepseek_v3 as GGUF architecture 'deepseek2'"));
  };
  return a;
}

}  // namespace

Family family() {
  DecoderTraits traits;  // DeepseekV3Config defaults
  auto& d = traits.defaults;
  d.vocab_size = 129280;
  d.hidden_size = 7168;
  d.intermediate_size = 18432;
  d.num_hidden_layers = 61;
  d.num_attention_heads = 128;
  d.num_key_value_heads = 128;
  d.head_dim = 64;
  d.max_position_embeddings = 4096;
  d.rms_norm_eps = 1e-6;
  d.moe.num_experts = 256;
  d.moe.num_experts_per_tok = 8;
  d.moe.moe_intermediate_size = 2048;
  d.moe.norm_topk_prob = true;
  d.moe.first_k_dense_replace = 3;
  d.moe.n_group = 8;
  d.moe.topk_group = 4;
  d.moe.routed_scaling_factor = 2.5;
  traits.fixed_head_dim = true;
  traits.moe = true;
  auto family = decoder_family<DeepseekV3Attention, DeepseekV3MLP, DeepseekV3RMSNorm, DeepseekV3DecoderLayer,
                               DeepseekV3Model, DeepseekV3ForCausalLM>("deepseek_v3", spec(), traits);
  add_moe_parts<DeepseekV3MoE, DeepseekV3TopkRouter, DeepseekV3Experts>(family, spec());
  for (auto& point : family.patch_points) {
    if (point.name == spec().attention) point.kind = kLatentAttention;
  }
  family.parse_config = [traits](const nlohmann::json& j, const std::string& source) {
    auto config = parse_decoder_config(j, source, traits);
    ConfigReader f(j, source);
    read_shared_experts(f, config.decoder.moe);
    config.fields = read_attention(f, config.decoder);
    return config;
  };
  auto tiny = tiny_decoder_preset("deepseek_v3", "DeepseekV3ForCausalLM");
  tiny.update({{"num_hidden_layers", 3}, {"num_key_value_heads", 4}, {"q_lora_rank", 48}, {"kv_lora_rank", 32},
               {"qk_nope_head_dim", 16}, {"qk_rope_head_dim", 8}, {"v_head_dim", 16}, {"n_routed_experts", 8},
               {"num_experts_per_tok", 2}, {"moe_intermediate_size", 32}, {"n_shared_experts", 1}, {"n_group", 2},
               {"topk_group", 1}, {"first_k_dense_replace", 1}, {"routed_scaling_factor", 2.5}});
  family.presets = {{"tiny-deepseek-v3", tiny}};
  family.gguf = gguf_architecture(family.parse_config);
  return family;
}

}  // namespace torchpatch::deepseek_v3
