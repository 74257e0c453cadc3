// OLMo 2 and OLMoE: q/k RMSNorm over each whole projection (all heads together), before RoPE.
// OLMo 2 puts its norms after attention and after the MLP instead of before them; OLMoE keeps
// pre-norm layers and routes every layer's MLP through softmax top-k experts (no shared expert, each
// expert intermediate_size wide, `clip_qkv` clamping the projections when set).
#include <cmath>

#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/models/decoder_family.h"
#include "torchpatch/printable.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch {

namespace {

nn::QkNormOptions projection_norm(const ModelConfig& config) {
  nn::QkNormOptions norm;
  norm.eps = config.decoder.rms_norm_eps;
  norm.per_head = false;
  const auto clip = config.raw.find("clip_qkv");
  if (clip != config.raw.end() && !clip->is_null()) {
    if (!clip->is_number() || !(clip->get<double>() > 0)) {
      throw ConfigError(fmt::format("config: clip_qkv must be a positive number or null, got {}", printable(clip->dump(), 50)));
    }
    norm.clip_qkv = clip->get<double>();
  }
  return norm;
}

// The norm spans every head: a kind of its own, whose split class sums the squares over the ranks
// (and reads the norm's options from the family).
void mark_projection_norm(Family& family) {
  for (auto& point : family.patch_points) {
    if (point.name == family.decoder->attention) point.kind = block_kind::kProjectionQkNormAttention;
  }
  family.qk_norm_options = projection_norm;
}

}  // namespace

namespace olmo2 {

namespace {

const DecoderSpec& spec() {
  static const DecoderSpec spec{"Olmo2Attention",    "Olmo2MLP",   "Olmo2RMSNorm",
                                "Olmo2DecoderLayer", "Olmo2Model", "Olmo2ForCausalLM"};
  return spec;
}

class Olmo2Attention : public nn::QkNormAttention {
 public:
  explicit Olmo2Attention(const BuildContext& ctx)
      : QkNormAttention(attention_options(model_config(ctx).decoder), projection_norm(model_config(ctx))) {}
};

class Olmo2MLP : public nn::GatedMlp {
 public:
  explicit Olmo2MLP(const BuildContext& ctx) : GatedMlp(mlp_options(ctx)) {}
};

class Olmo2RMSNorm : public nn::RmsNorm {
 public:
  explicit Olmo2RMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps) {}
};

// Norms on the blocks' outputs: post_attention_layernorm and post_feedforward_layernorm.
class Olmo2DecoderLayer : public roles::DecoderLayer {
 public:
  explicit Olmo2DecoderLayer(const BuildContext& ctx) {
    const auto& s = spec();
    self_attn = register_module("self_attn", build<roles::Attention>(s.attention, ctx.child("self_attn")));
    mlp = register_module("mlp", build<roles::Mlp>(s.mlp, ctx.child("mlp")));
    post_attention_layernorm =
        register_module("post_attention_layernorm", build<roles::Norm>(s.norm, ctx.child("post_attention_layernorm")));
    post_feedforward_layernorm =
        register_module("post_feedforward_layernorm", build<roles::Norm>(s.norm, ctx.child("post_feedforward_layernorm")));
  }

  std::shared_ptr<roles::Attention> self_attn;
  std::shared_ptr<roles::Mlp> mlp;
  std::shared_ptr<roles::Norm> post_attention_layernorm, post_feedforward_layernorm;

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const AttentionInputs& inputs) override {
    auto h = hidden + post_attention_layernorm->forward(self_attn->forward(hidden, inputs));
    return h + post_feedforward_layernorm->forward(mlp->forward(h));
  }
};

class Olmo2Model : public DecoderModel {
 public:
  explicit Olmo2Model(const BuildContext& ctx) : DecoderModel(ctx, spec()) {}
};

class Olmo2ForCausalLM : public DecoderForCausalLM {
 public:
  explicit Olmo2ForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}
};

// llama.cpp's "olmo2" files: its converter writes OLMo 3 under the same name, with sliding layers,
// which the OLMo 2 modules here do not have.
nlohmann::json gguf_config(const GgufMetadata& m) {
  if (const auto window = m.integer_or("attention.sliding_window"); window && *window > 0) {
    m.fail(m.full("attention.sliding_window"),
           fmt::format("{}: sliding-window layers (an OLMo 3 file); torchpatch reads 'olmo2' files of OLMo 2, "
                       "whose layers all attend to every earlier token",
                       *window));
  }
  return gguf_decoder_config(m, "olmo2", "Olmo2ForCausalLM");
}

// llama.cpp's OLMo 2 does not clamp the projections: a clip_qkv config is refused.
std::vector<std::pair<std::string, checkpoint::GgufValue>> gguf_metadata(const nlohmann::json& c) {
  if (c.contains("clip_qkv") && !c["clip_qkv"].is_null()) {
    throw ConfigError(fmt::format("olmo2 as GGUF architecture 'olmo2': clip_qkv {} (llama.cpp's olmo2 does not clamp "
                                  "q, k and v; set it to null)",
                                  printable(c["clip_qkv"].dump(), 50)));
  }
  return gguf_decoder_metadata("olmo2", c);
}

// Norms after attention and the MLP (blk.N.post_attention_norm, post_ffw_norm), q/k norms over the
// whole projection (blk.N.attn_q_norm, attn_k_norm, hidden_size wide), q/k rows as Hugging Face's.
GgufArchitecture gguf_architecture() {
  GgufArchitecture a;
  a.names = {"olmo2"};
  a.config = gguf_config;
  a.tensors = gguf_post_norm_tensor_names(/*permuted_qk=*/false);
  a.metadata = gguf_metadata;
  return a;
}

}  // namespace

Family family() {
  DecoderTraits traits;  // Olmo2Config defaults
  auto& d = traits.defaults;
  d.vocab_size = 50304;
  d.hidden_size = 4096;
  d.intermediate_size = 11008;
  d.num_hidden_layers = 32;
  d.num_attention_heads = 32;
  d.num_key_value_heads = 0;  // None: as many as attention heads
  d.max_position_embeddings = 2048;
  d.rms_norm_eps = 1e-5;
  auto family = decoder_family<Olmo2Attention, Olmo2MLP, Olmo2RMSNorm, Olmo2DecoderLayer, Olmo2Model,
                               Olmo2ForCausalLM>("olmo2", spec(), traits);
  mark_projection_norm(family);
  family.presets = {{"tiny-olmo2", tiny_decoder_preset("olmo2", "Olmo2ForCausalLM")}};
  family.gguf = gguf_architecture();
  return family;
}

}  // namespace olmo2

namespace olmoe {

namespace {

const DecoderSpec& spec() {
  static const DecoderSpec spec{"OlmoeAttention",      "",                "OlmoeRMSNorm",
                                "OlmoeDecoderLayer",   "OlmoeModel",      "OlmoeForCausalLM",
                                "OlmoeSparseMoeBlock", "OlmoeTopKRouter", "OlmoeExperts"};
  return spec;
}

class OlmoeAttention : public nn::QkNormAttention {
 public:
  explicit OlmoeAttention(const BuildContext& ctx)
      : QkNormAttention(attention_options(model_config(ctx).decoder), projection_norm(model_config(ctx))) {}
};

class OlmoeRMSNorm : public nn::RmsNorm {
 public:
  explicit OlmoeRMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps) {}
};

class OlmoeTopKRouter : public nn::TopKRouter {
 public:
  explicit OlmoeTopKRouter(const BuildContext& ctx) : TopKRouter(router_options(model_config(ctx).decoder)) {}
};

class OlmoeExperts : public nn::FusedExperts {
 public:
  explicit OlmoeExperts(const BuildContext& ctx) : FusedExperts(experts_options(model_config(ctx).decoder)) {}
};

class OlmoeSparseMoeBlock : public SparseMoeBlock {
 public:
  explicit OlmoeSparseMoeBlock(const BuildContext& ctx) : SparseMoeBlock(ctx, spec()) {}
};

class OlmoeDecoderLayer : public PreNormDecoderLayer {
 public:
  explicit OlmoeDecoderLayer(const BuildContext& ctx) : PreNormDecoderLayer(ctx, spec()) {}
};

class OlmoeModel : public DecoderModel {
 public:
  explicit OlmoeModel(const BuildContext& ctx) : DecoderModel(ctx, spec()) {}
};

class OlmoeForCausalLM : public DecoderForCausalLM {
 public:
  explicit OlmoeForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}
};

// A file llama.cpp's converter wrote as "olmoe", as llama.cpp runs it: every layer sparse, each expert
// feed_forward_length wide, the top-k weights as the softmax gives them. The converter writes
// attention.layer_norm_rms_epsilon 1e-5 whatever the checkpoint's rms_norm_eps (OLMoE-1B-7B's), and
// llama.cpp runs the file with that; so does torchpatch.
nlohmann::json gguf_config(const GgufMetadata& m) {
  auto c = gguf_decoder_config(m, "olmoe", "OlmoeForCausalLM");
  gguf_moe_config(m, c, /*normalized=*/false);
  return c;
}

// llama.cpp's OLMoE clamps nothing and renormalizes nothing: clip_qkv and norm_topk_prob are refused.
std::vector<std::pair<std::string, checkpoint::GgufValue>> gguf_metadata(const nlohmann::json& c,
                                                                        const DecoderTraits& traits) {
  const std::string source = "olmoe as GGUF architecture 'olmoe'";
  if (c.contains("clip_qkv") && !c["clip_qkv"].is_null()) {
    throw ConfigError(fmt::format("{}: clip_qkv {} (llama.cpp's olmoe does not clamp q, k and v; set it to null)",
                                  source, printable(c["clip_qkv"].dump(), 50)));
  }
  auto m = gguf_decoder_metadata("olmoe", c);
  const auto moe = parse_decoder_config(c, source, traits).decoder.moe;
  for (auto& key : gguf_moe_metadata("olmoe", moe, /*normalized=*/false, source)) m.push_back(std::move(key));
  return m;
}

// The usual tensors (q/k norms over the whole projection, as OLMo 2's) and the experts stacked.
GgufArchitecture gguf_architecture(const DecoderTraits& traits) {
  GgufArchitecture a;
  a.names = {"olmoe"};
  a.config = gguf_config;
  a.tensors = gguf_decoder_tensor_names(/*permuted_qk=*/false);
  for (auto& n : gguf_expert_tensor_names()) a.tensors.push_back(std::move(n));
  a.metadata = [traits](const nlohmann::json& c) { return gguf_metadata(c, traits); };
  return a;
}

}  // namespace

Family family() {
  DecoderTraits traits;  // OlmoeConfig defaults
  auto& d = traits.defaults;
  d.vocab_size = 50304;
  d.hidden_size = 2048;
  d.intermediate_size = 2048;
  d.num_hidden_layers = 16;
  d.num_attention_heads = 16;
  d.num_key_value_heads = 0;  // None: as many as attention heads
  d.max_position_embeddings = 4096;
  d.rms_norm_eps = 1e-5;
  d.moe.num_experts = 64;
  d.moe.num_experts_per_tok = 8;
  d.moe.router_aux_loss_coef = 0.01;
  traits.moe = true;
  traits.expert_width_field = "intermediate_size";
  auto family = decoder_family<OlmoeAttention, void, OlmoeRMSNorm, OlmoeDecoderLayer, OlmoeModel, OlmoeForCausalLM>(
      "olmoe", spec(), traits);
  add_moe_parts<OlmoeSparseMoeBlock, OlmoeTopKRouter, OlmoeExperts>(family, spec());
  mark_projection_norm(family);
  auto tiny = tiny_decoder_preset("olmoe", "OlmoeForCausalLM");
  tiny.update({{"num_experts", 4}, {"num_experts_per_tok", 2}, {"num_key_value_heads", 4}});
  family.presets = {{"tiny-olmoe", tiny}};
  family.gguf = gguf_architecture(traits);
  return family;
}

}  // namespace olmoe

}  // namespace torchpatch
