// Attention masks in the eager format: additive float [B, 1, Q, KV], 0 where a query may attend
// and the dtype's lowest value where it may not.
#pragma once

#include "torchpatch/export.h"

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace torchpatch::nn {

/// Causal mask for `q_len` queries at absolute positions past_len .. past_len+q_len-1 over
/// past_len+q_len keys, combined with `padding_mask` [B, KV] (1 = real token) when defined.
TORCHPATCH_API at::Tensor causal_mask(const at::Tensor& padding_mask, int64_t batch, int64_t q_len, int64_t past_len,
                       c10::ScalarType dtype);

}  // namespace torchpatch::nn
