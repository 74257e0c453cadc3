// Grouped-query self-attention for the decoder families, and the eager attention math it runs.
#pragma once

#include "torchpatch/export.h"

#include <optional>

#include "torchpatch/nn/linear.h"
#include "torchpatch/patching/roles.h"

namespace torchpatch::nn {

/// Eager attention: q [B, nH, Q, hd], k/v [B, nKV, KV, hd] (repeated to nH heads), additive mask
/// [B, 1, Q, KV] or undefined. Scores are `q k^T * scaling`, soft-capped to (-cap, cap) with
/// tanh when `softcap` is set (Gemma2), then masked. Softmax in float32 and cast back (the decoder
/// families), or in the input dtype without `upcast_softmax` (BERT). Returns [B, Q, nH, hd]; the
/// probabilities [B, nH, Q, KV] go to `weights_out` when given.
TORCHPATCH_API at::Tensor eager_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& mask, double scaling, at::Tensor* weights_out = nullptr,
                                          bool upcast_softmax = true, std::optional<double> softcap = std::nullopt);

/// How eager_attention computes more query rows than a decoding step has (prefill, whole sequences).
enum class PrefillAttention {
  kEager,  ///< two matmuls and a softmax, the [Q, KV] scores in memory (Hugging Face's eager path)
  kFused,  ///< LibTorch's scaled_dot_product_attention (flash attention on CPU: keys in blocks, an
           ///< online softmax); LibTorch 2.5 and later, float32, without soft cap or returned weights
};

/// Chooses the prefill attention for the whole process and returns the previous choice. The default
/// is kFused where LibTorch has it (docs/benchmarks.md, "Prefill attention"); kEager elsewhere.
TORCHPATCH_API PrefillAttention set_prefill_attention(PrefillAttention kind);
/// The prefill attention in use now.
TORCHPATCH_API PrefillAttention prefill_attention();

/// Head layout of grouped-query attention.
struct TORCHPATCH_API GqaShape {
  int64_t num_heads;
  int64_t num_key_value_heads;
  int64_t head_dim;
  double scaling;                   ///< usually head_dim ** -0.5
  std::optional<double> softcap{};  ///< attention-logit soft-capping (Gemma2)
};

/// Everything after the projections: q [B, Q, nH*hd], k/v [B, Q, nKV*hd] -> RoPE, the cache (when
/// `inputs.cache` is set), eager attention -> [B, Q, nH*hd] (before the output projection). Shared by
/// every decoder attention class, so a replacement that calls it gets caching and masks for free.
TORCHPATCH_API at::Tensor grouped_query_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const AttentionInputs& inputs, const GqaShape& shape);

/// How a grouped-query attention is laid out.
struct TORCHPATCH_API GqaOptions {
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  bool qkv_bias = false;  ///< biases on q/k/v
  bool o_bias = false;    ///< a bias on o_proj
  double scaling = 0;     ///< 0 = head_dim ** -0.5
  std::optional<double> softcap{};  ///< attention-logit soft-capping (Gemma2)
};

/// Self-attention with separate q/k/v/o projections and grouped key/value heads.
/// State dict: q_proj [nH*hd, H], k_proj [nKV*hd, H], v_proj [nKV*hd, H], o_proj [H, nH*hd]
/// (+ q/k/v biases with qkv_bias, an o_proj bias with o_bias).
class TORCHPATCH_API GqaAttention : public roles::Attention {
 public:
  explicit GqaAttention(const GqaOptions& options);

  std::shared_ptr<roles::Linear> q_proj, k_proj, v_proj, o_proj;
  int64_t num_heads;
  int64_t num_key_value_heads;
  int64_t head_dim;
  double scaling;
  std::optional<double> softcap;

  GqaShape shape() const { return {num_heads, num_key_value_heads, head_dim, scaling, softcap}; }

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const AttentionInputs& inputs) override;
};

/// How QkNormAttention normalises queries and keys.
struct TORCHPATCH_API QkNormOptions {
  double eps = 1e-6;
  /// Without it the block is plain grouped-query attention with no q_norm/k_norm (GLM-4.5's
  /// `use_qk_norm` false).
  bool enabled = true;
  /// Each head's vector (Qwen3, Gemma 3: weights [hd]), or each whole projection, all heads together
  /// (OLMo 2, OLMoE: q_norm [nH*hd], k_norm [nKV*hd]).
  bool per_head = true;
  /// Gemma's RMSNorm, `x * (1 + weight)` (Gemma 3).
  bool unit_offset = false;
  /// Clamp q, k and v to [-c, c] after their projections (OLMoE's `clip_qkv`); none when unset.
  std::optional<double> clip_qkv{};
};

/// Grouped-query attention with an RMSNorm on queries and keys before RoPE, per head or over the whole
/// projection (QkNormOptions).
class TORCHPATCH_API QkNormAttention : public GqaAttention {
 public:
  QkNormAttention(const GqaOptions& options, double norm_eps);
  QkNormAttention(const GqaOptions& options, const QkNormOptions& norm);

  std::shared_ptr<roles::Norm> q_norm, k_norm;
  QkNormOptions norm_options;

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const AttentionInputs& inputs) override;
};

}  // namespace torchpatch::nn
