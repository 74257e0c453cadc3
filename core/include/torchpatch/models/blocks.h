// Blocks the decoder families share that are made of patch points or read a decoder config: the
// pre-norm decoder layer, the sparse MoE block, attention with fused projections. (Blocks that take
// plain options live in nn/.)
#pragma once

#include "torchpatch/export.h"

#include <memory>
#include <string>
#include <vector>

#include "torchpatch/models/config.h"
#include "torchpatch/models/decoder_spec.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/nn/moe.h"
#include "torchpatch/patching/roles.h"

namespace torchpatch {

/// The typed config a decoder patch point was built for (ConfigError when it is not a ModelConfig).
TORCHPATCH_API const ModelConfig& model_config(const BuildContext& ctx);

// Options of the nn blocks, read from a decoder config.
TORCHPATCH_API nn::GqaOptions attention_options(const DecoderConfig& config);
/// The options of `config`'s family's grouped-query attention (Family::attention_options: Gemma2's
/// query scale and soft cap), or the shared ones: what a replacement of that attention starts from.
TORCHPATCH_API nn::GqaOptions family_attention_options(const ModelConfig& config);
/// The q/k norm of `config`'s family's attention (Family::qk_norm_options), or per head with the
/// config's rms_norm_eps.
TORCHPATCH_API nn::QkNormOptions family_qk_norm_options(const ModelConfig& config);
/// Where `config`'s family keeps its experts in hub checkpoints (Qwen's names when it says nothing).
TORCHPATCH_API const ExpertsLayout& experts_layout(const ModelConfig& config);
/// ctx.args "intermediate_size" overrides the width (a MoE block's shared expert).
TORCHPATCH_API nn::MlpOptions mlp_options(const BuildContext& ctx);
TORCHPATCH_API nn::RouterOptions router_options(const DecoderConfig& config);
TORCHPATCH_API nn::GroupedRouterOptions grouped_router_options(const DecoderConfig& config);
TORCHPATCH_API nn::ExpertsOptions experts_options(const DecoderConfig& config);
TORCHPATCH_API nn::ClampedSwigluExpertsOptions clamped_swiglu_experts_options(const DecoderConfig& config);

/// A pre-norm decoder layer: attention and MLP, each behind a norm and a residual connection.
class TORCHPATCH_API PreNormDecoderLayer : public roles::DecoderLayer {
 public:
  PreNormDecoderLayer(const BuildContext& ctx, const DecoderSpec& spec);

  std::shared_ptr<roles::Attention> self_attn;
  std::shared_ptr<roles::Mlp> mlp;
  std::shared_ptr<roles::Norm> input_layernorm;
  std::shared_ptr<roles::Norm> post_attention_layernorm;

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const AttentionInputs& inputs) override;
};

/// Grouped-query attention with one fused `qkv_proj` [(nH + 2 nKV) * hd, H] and `o_proj`: Phi-3's
/// layout, and the FusedQKVAttention replacement's. One matmul instead of three.
class TORCHPATCH_API FusedQkvAttention : public roles::Attention {
 public:
  /// q/k/v biases from options.qkv_bias (on qkv_proj), o_proj's from options.o_bias.
  explicit FusedQkvAttention(const nn::GqaOptions& options);

  std::shared_ptr<roles::Linear> qkv_proj, o_proj;

  /// The split sizes of qkv_proj's output: {nH * hd, nKV * hd, nKV * hd}.
  static std::vector<int64_t> split_sizes(const DecoderConfig& config);

 protected:
  // hidden [B, Q, H] -> q [B, Q, nH*hd], k/v [B, Q, nKV*hd] -> [B, Q, H]
  at::Tensor forward_impl(const at::Tensor& hidden, const AttentionInputs& inputs) override;

 private:
  std::vector<int64_t> sizes_;
  nn::GqaShape shape_{};
};

/// `XSparseMoeBlock` (fills an MLP slot): route, run the chosen experts, add the shared expert
/// scaled by sigmoid(shared_expert_gate(x)).
class TORCHPATCH_API SparseMoeBlock : public roles::Mlp {
 public:
  SparseMoeBlock(const BuildContext& ctx, const DecoderSpec& spec);

  at::Tensor forward(const at::Tensor& hidden) override;

  std::shared_ptr<roles::Router> gate;
  std::shared_ptr<roles::Experts> experts;
  std::shared_ptr<roles::Mlp> shared_expert;       ///< null without a shared expert
  std::shared_ptr<roles::Linear> shared_expert_gate;  ///< [1, H]; null without a shared expert or its gate
};

}  // namespace torchpatch
