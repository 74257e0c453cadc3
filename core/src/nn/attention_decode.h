// Internal: attention for a few query tokens over a long key/value cache (decoding).
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

namespace torchpatch::nn {

/// Whether `decode_attention` serves these inputs: float32, few query rows per key/value head, no
/// gradient wanted, last dimensions contiguous.
bool decode_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask);

/// The same result as `eager_attention` without attention weights: q [B, nH, Q, hd], k/v
/// [B, nKV, KV, hd], additive mask broadcastable to [B, nH, Q, KV] or undefined -> [B, Q, nH, hd].
/// Reads each cached key and value once, with no copies of the cache.
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scaling, std::optional<double> softcap);

}  // namespace torchpatch::nn
