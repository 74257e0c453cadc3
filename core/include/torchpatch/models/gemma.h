// Gemma (hf-semantics 5.7) and Gemma2 (5.8): Llama's tree and keys with embeddings scaled by
// sqrt(hidden), RMSNorm as x * (1 + weight) in float32, a gelu_pytorch_tanh MLP and an explicit
// head_dim; Gemma2 adds four norms per layer, soft-capped attention and final logits, a query scale
// of its own and sliding windows on even layers. The built-in classes are exported so replacements
// can derive from them.
#pragma once

#include "torchpatch/export.h"

#include <optional>

#include "torchpatch/models/decoder.h"
#include "torchpatch/models/family.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch::gemma {

/// Patch points: GemmaAttention, GemmaMLP, GemmaRMSNorm, GemmaDecoderLayer, GemmaModel, GemmaForCausalLM.
TORCHPATCH_API const DecoderSpec& spec();
/// The family descriptor (registered with the built-in families).
Family family();

class TORCHPATCH_API GemmaAttention : public nn::GqaAttention {
 public:
  explicit GemmaAttention(const BuildContext& ctx) : GqaAttention(attention_options(model_config(ctx).decoder)) {}
};

class TORCHPATCH_API GemmaMLP : public nn::GatedMlp {
 public:
  explicit GemmaMLP(const BuildContext& ctx) : GatedMlp(mlp_options(ctx)) {}
};

/// x * (1 + weight), in float32 before the cast back; weight initialised to zeros.
class TORCHPATCH_API GemmaRMSNorm : public nn::RmsNorm {
 public:
  explicit GemmaRMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps, /*unit_offset=*/true) {}
};

class TORCHPATCH_API GemmaDecoderLayer : public PreNormDecoderLayer {
 public:
  explicit GemmaDecoderLayer(const BuildContext& ctx) : PreNormDecoderLayer(ctx, spec()) {}
};

/// Embeddings times sqrt(hidden_size), the factor rounded to the activation dtype first.
class TORCHPATCH_API GemmaModel : public DecoderModel {
 public:
  explicit GemmaModel(const BuildContext& ctx) : DecoderModel(ctx, spec()) {}
  GemmaModel(const BuildContext& ctx, const DecoderSpec& spec) : DecoderModel(ctx, spec) {}

 protected:
  at::Tensor embed(const at::Tensor& ids) override;
};

class TORCHPATCH_API GemmaForCausalLM : public DecoderForCausalLM {
 public:
  explicit GemmaForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}
};

}  // namespace torchpatch::gemma

namespace torchpatch::gemma2 {

/// Patch points: Gemma2Attention, Gemma2MLP, Gemma2RMSNorm, Gemma2DecoderLayer, Gemma2Model, Gemma2ForCausalLM.
TORCHPATCH_API const DecoderSpec& spec();
Family family();

/// Gemma2Config's own fields.
struct TORCHPATCH_API Gemma2Config : FamilyFields {
  double query_pre_attn_scalar = 224;                 ///< attention scores are scaled by its inverse square root
  std::optional<double> attn_logit_softcapping = 50;  ///< tanh(s / cap) * cap on attention scores
  std::optional<double> final_logit_softcapping = 30; ///< the same on the logits
  void to_json(nlohmann::json& j) const override;
};

class TORCHPATCH_API Gemma2Attention : public nn::GqaAttention {
 public:
  explicit Gemma2Attention(const BuildContext& ctx);
};

class TORCHPATCH_API Gemma2MLP : public nn::GatedMlp {
 public:
  explicit Gemma2MLP(const BuildContext& ctx) : GatedMlp(mlp_options(ctx)) {}
};

class TORCHPATCH_API Gemma2RMSNorm : public nn::RmsNorm {
 public:
  explicit Gemma2RMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps, /*unit_offset=*/true) {}
};

/// Norms around both sublayers: input/post_attention around attention, pre/post_feedforward around the MLP.
class TORCHPATCH_API Gemma2DecoderLayer : public roles::DecoderLayer {
 public:
  explicit Gemma2DecoderLayer(const BuildContext& ctx);
  /// The same layer of another family (Gemma 3) from its classes.
  Gemma2DecoderLayer(const BuildContext& ctx, const DecoderSpec& spec);

  std::shared_ptr<roles::Attention> self_attn;
  std::shared_ptr<roles::Mlp> mlp;
  std::shared_ptr<roles::Norm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<roles::Norm> pre_feedforward_layernorm, post_feedforward_layernorm;

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const AttentionInputs& inputs) override;
};

class TORCHPATCH_API Gemma2Model : public gemma::GemmaModel {
 public:
  explicit Gemma2Model(const BuildContext& ctx) : GemmaModel(ctx, spec()) {}
};

/// Final logits soft-capped: tanh(logits / cap) * cap.
class TORCHPATCH_API Gemma2ForCausalLM : public DecoderForCausalLM {
 public:
  explicit Gemma2ForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}
  Gemma2ForCausalLM(const BuildContext& ctx, const DecoderSpec& spec) : DecoderForCausalLM(ctx, spec) {}

 protected:
  at::Tensor logits(const at::Tensor& hidden) override;
};

}  // namespace torchpatch::gemma2

namespace torchpatch::gemma3 {

/// Gemma 3's text model (model_type "gemma3_text"): Gemma2's layers and fields (no soft caps by
/// default) with a per-head q/k norm of Gemma's form, sliding and full layers (`layer_types`, or all
/// but every `sliding_window_pattern`-th layer), and a RoPE of their own for the sliding layers
/// (v5's rope_parameters per layer type, or `rope_local_base_freq`).
/// Patch points: Gemma3Attention, Gemma3MLP, Gemma3RMSNorm, Gemma3DecoderLayer, Gemma3TextModel, Gemma3ForCausalLM.
TORCHPATCH_API const DecoderSpec& spec();
Family family();

class TORCHPATCH_API Gemma3Attention : public nn::QkNormAttention {
 public:
  explicit Gemma3Attention(const BuildContext& ctx);
};

class TORCHPATCH_API Gemma3MLP : public nn::GatedMlp {
 public:
  explicit Gemma3MLP(const BuildContext& ctx) : GatedMlp(mlp_options(ctx)) {}
};

class TORCHPATCH_API Gemma3RMSNorm : public nn::RmsNorm {
 public:
  explicit Gemma3RMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps, /*unit_offset=*/true) {}
};

class TORCHPATCH_API Gemma3DecoderLayer : public gemma2::Gemma2DecoderLayer {
 public:
  explicit Gemma3DecoderLayer(const BuildContext& ctx) : Gemma2DecoderLayer(ctx, spec()) {}
};

class TORCHPATCH_API Gemma3TextModel : public gemma::GemmaModel {
 public:
  explicit Gemma3TextModel(const BuildContext& ctx) : GemmaModel(ctx, spec()) {}
};

class TORCHPATCH_API Gemma3ForCausalLM : public gemma2::Gemma2ForCausalLM {
 public:
  explicit Gemma3ForCausalLM(const BuildContext& ctx) : Gemma2ForCausalLM(ctx, spec()) {}
};

}  // namespace torchpatch::gemma3
