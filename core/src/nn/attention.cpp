#include "torchpatch/nn/attention.h"

#include <atomic>
#include <cmath>
#include <stdexcept>

#include <ATen/ATen.h>
#include <torch/csrc/api/include/torch/version.h>

#include "nn/attention_decode.h"
#include "torchpatch/nn/rms_norm.h"
#include "torchpatch/nn/rotary.h"

namespace torchpatch::nn {
namespace {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
constexpr bool kHaveFusedAttention = true;  // scaled_dot_product_attention with enable_gqa
#else
constexpr bool kHaveFusedAttention = false;
#endif

std::atomic<PrefillAttention> chosen_prefill_attention{kHaveFusedAttention ? PrefillAttention::kFused
                                                                    : PrefillAttention::kEager};

// The fused kernel computes what the eager path does, except that it neither returns the weights nor
// soft-caps, and in half precision it keeps the probabilities in float32 where eager rounds them: on
// the CPU it runs for float32 only, on CUDA (flash and memory-efficient kernels) for every float type.
bool fused_attention_applies(const at::Tensor& q, const at::Tensor& mask, const at::Tensor* weights_out,
                             const std::optional<double>& softcap) {
  return kHaveFusedAttention && chosen_prefill_attention.load(std::memory_order_relaxed) == PrefillAttention::kFused &&
         !weights_out && !softcap && (q.scalar_type() == at::kFloat || q.is_cuda()) &&
         (!mask.defined() || mask.scalar_type() == q.scalar_type());
}

at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                           double scaling) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
  const auto out = at::scaled_dot_product_attention(q, k, v, mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt,
                                                    /*dropout_p=*/0.0, /*is_causal=*/false, scaling,
                                                    /*enable_gqa=*/k.size(1) != q.size(1));
  return out.transpose(1, 2).contiguous();  // [B, Q, nH, vd]
#else
  throw std::logic_error("fused attention needs LibTorch 2.5 or later");  // fused_attention_applies is false
#endif
}

}  // namespace

PrefillAttention set_prefill_attention(PrefillAttention kind) {
  return chosen_prefill_attention.exchange(kHaveFusedAttention ? kind : PrefillAttention::kEager);
}

PrefillAttention prefill_attention() { return chosen_prefill_attention.load(std::memory_order_relaxed); }

at::Tensor eager_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& mask, double scaling, at::Tensor* weights_out, bool upcast_softmax,
                           std::optional<double> softcap) {
  if (!weights_out && decode_attention_applies(q, k, v, mask)) return decode_attention(q, k, v, mask, scaling, softcap);
  if (fused_attention_applies(q, mask, weights_out, softcap)) return fused_attention(q, k, v, mask, scaling);
  const auto b = q.size(0), heads = q.size(1), len = q.size(2), hd = q.size(3);
  const auto kv_heads = k.size(1), kv_len = k.size(2);
  const int64_t groups = heads / kv_heads;
  // Query head h reads key/value head h / groups. Folding each group's heads into the query axis,
  // [B, nKV, groups*Q, hd], lets one matmul per key/value head serve the whole group, without
  // copying the keys and values `groups` times (Hugging Face's repeat_kv).
  auto query = q.reshape({b, kv_heads, groups * len, hd});
  auto scores = (at::matmul(query, k.transpose(2, 3)) * scaling).view({b, heads, len, kv_len});  // [B, nH, Q, KV]
  if (softcap) scores = at::tanh(scores / *softcap) * *softcap;
  if (mask.defined()) scores = scores + mask;
  // Softmax in at least float32 (float64 stays float64: its mask's lowest value has no float32 form).
  auto probs = upcast_softmax ? at::softmax(scores, -1, reduction_type(q.scalar_type())).to(q.scalar_type())
                              : at::softmax(scores, -1);
  if (weights_out) *weights_out = probs;
  auto out = at::matmul(probs.view({b, kv_heads, groups * len, kv_len}), v);  // [B, nKV, groups*Q, vd]
  return out.view({b, heads, len, v.size(3)}).transpose(1, 2).contiguous();   // [B, Q, nH, vd]
}

GqaAttention::GqaAttention(const GqaOptions& o)
    : num_heads(o.num_heads),
      num_key_value_heads(o.num_key_value_heads),
      head_dim(o.head_dim),
      scaling(o.scaling > 0 ? o.scaling : 1.0 / std::sqrt(static_cast<double>(o.head_dim))),
      softcap(o.softcap) {
  const auto in = o.hidden_size;
  q_proj = register_module("q_proj", make_linear("q_proj", in, num_heads * head_dim, o.qkv_bias));
  k_proj = register_module("k_proj", make_linear("k_proj", in, num_key_value_heads * head_dim, o.qkv_bias));
  v_proj = register_module("v_proj", make_linear("v_proj", in, num_key_value_heads * head_dim, o.qkv_bias));
  o_proj = register_module("o_proj", make_linear("o_proj", num_heads * head_dim, in, o.o_bias));
}

at::Tensor GqaAttention::forward_impl(const at::Tensor& hidden, const AttentionInputs& inputs) {
  return o_proj->forward(grouped_query_attention(q_proj->forward(hidden), k_proj->forward(hidden), v_proj->forward(hidden),
                                                 inputs, shape()));
}

QkNormAttention::QkNormAttention(const GqaOptions& options, double norm_eps)
    : QkNormAttention(options, QkNormOptions{norm_eps}) {}

QkNormAttention::QkNormAttention(const GqaOptions& options, const QkNormOptions& norm)
    : GqaAttention(options), norm_options(norm) {
  if (!norm.enabled) return;
  const int64_t q_width = norm.per_head ? head_dim : num_heads * head_dim;
  const int64_t k_width = norm.per_head ? head_dim : num_key_value_heads * head_dim;
  q_norm = register_module("q_norm", std::make_shared<RmsNorm>(q_width, norm.eps, norm.unit_offset));
  k_norm = register_module("k_norm", std::make_shared<RmsNorm>(k_width, norm.eps, norm.unit_offset));
}

at::Tensor QkNormAttention::forward_impl(const at::Tensor& hidden, const AttentionInputs& inputs) {
  const auto b = hidden.size(0), len = hidden.size(1);
  auto q = q_proj->forward(hidden), k = k_proj->forward(hidden), v = v_proj->forward(hidden);
  if (const auto c = norm_options.clip_qkv) {
    q = q.clamp(-*c, *c);
    k = k.clamp(-*c, *c);
    v = v.clamp(-*c, *c);
  }
  if (!norm_options.enabled) {
    // no norm
  } else if (norm_options.per_head) {  // each head's vector: [B, Q, heads, hd] over hd
    q = q_norm->forward(q.view({b, len, num_heads, head_dim})).reshape({b, len, -1});
    k = k_norm->forward(k.view({b, len, num_key_value_heads, head_dim})).reshape({b, len, -1});
  } else {
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  return o_proj->forward(grouped_query_attention(q, k, v, inputs, shape()));
}

at::Tensor grouped_query_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const AttentionInputs& inputs, const GqaShape& shape) {
  const auto b = q.size(0), len = q.size(1);
  auto query = q.view({b, len, shape.num_heads, shape.head_dim}).transpose(1, 2);  // [B, nH, Q, hd]
  auto key = k.view({b, len, shape.num_key_value_heads, shape.head_dim}).transpose(1, 2);
  auto value = v.view({b, len, shape.num_key_value_heads, shape.head_dim}).transpose(1, 2);
  if (inputs.cos.defined()) {  // undefined: a layer without positions (SmolLM3's NoPE layers)
    query = apply_rotary(query, inputs.cos, inputs.sin);
    key = apply_rotary(key, inputs.cos, inputs.sin);
  }
  if (inputs.cache) std::tie(key, value) = inputs.cache->update(key, value, inputs.layer_idx);  // [B, nKV, KV, hd]
  auto out = eager_attention(query, key, value, inputs.mask, shape.scaling, inputs.weights_out, true,
                             shape.softcap);  // [B, Q, nH, hd]
  return out.reshape({b, len, shape.num_heads * shape.head_dim});
}

}  // namespace torchpatch::nn
