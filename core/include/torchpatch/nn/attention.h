// Grouped-query self-attention for the decoder families, and the eager attention math it runs.
#pragma once

#include "torchpatch/export.h"


#include "torchpatch/nn/linear.h"
#include "torchpatch/patching/roles.h"

namespace torchpatch::nn {

/// Eager attention: q [B, nH, Q, hd], k/v [B, nKV, KV, hd] (repeated to nH heads), additive mask
/// [B, 1, Q, KV] or undefined. Softmax in float32 and cast back (the decoder families), or in the
/// input dtype without `upcast_softmax` (BERT). Returns [B, Q, nH, hd]; the probabilities
/// [B, nH, Q, KV] go to `weights_out` when given.
TORCHPATCH_API at::Tensor eager_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& mask, double scaling, at::Tensor* weights_out = nullptr,
                                          bool upcast_softmax = true);

/// Head layout of grouped-query attention.
struct TORCHPATCH_API GqaShape {
  int64_t num_heads;
  int64_t num_key_value_heads;
  int64_t head_dim;
  double scaling;  ///< head_dim ** -0.5
};

/// Everything after the projections: q [B, Q, nH*hd], k/v [B, Q, nKV*hd] -> RoPE, the cache (when
/// `inputs.cache` is set), eager attention -> [B, Q, nH*hd] (before the output projection). Shared by
/// every decoder attention class, so a replacement that calls it gets caching and masks for free.
TORCHPATCH_API at::Tensor grouped_query_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const AttentionInputs& inputs, const GqaShape& shape);

/// Self-attention with separate q/k/v/o projections and grouped key/value heads.
/// State dict: q_proj [nH*hd, H], k_proj [nKV*hd, H], v_proj [nKV*hd, H], o_proj [H, nH*hd]
/// (+ q/k/v biases when config.qkv_bias, an o_proj bias when config.o_bias).
class TORCHPATCH_API GqaAttention : public roles::Attention {
 public:
  explicit GqaAttention(const BuildContext& ctx);

  at::Tensor forward(const at::Tensor& hidden, const AttentionInputs& inputs) override;

  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
  int64_t num_heads;
  int64_t num_key_value_heads;
  int64_t head_dim;
  int64_t layer_idx;
  double scaling;  ///< head_dim ** -0.5

  GqaShape shape() const { return {num_heads, num_key_value_heads, head_dim, scaling}; }
};

/// Grouped-query attention with a per-head RMSNorm on queries and keys before RoPE (Qwen3):
/// q_norm.weight [hd], k_norm.weight [hd].
class TORCHPATCH_API QkNormAttention : public GqaAttention {
 public:
  explicit QkNormAttention(const BuildContext& ctx);

  at::Tensor forward(const at::Tensor& hidden, const AttentionInputs& inputs) override;

  std::shared_ptr<roles::Norm> q_norm, k_norm;
};

}  // namespace torchpatch::nn
