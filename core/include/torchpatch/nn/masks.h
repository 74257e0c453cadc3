// Attention masks in the eager format: additive float [B, 1, Q, KV], 0 where a query may attend
// and the dtype's lowest value where it may not.
#pragma once

#include "torchpatch/export.h"

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

namespace torchpatch::nn {

/// Where a layer's keys sit in absolute positions: `length` keys starting at position `offset`.
struct TORCHPATCH_API MaskSizes {
  int64_t length;
  int64_t offset;
};

/// Where the queries and keys of one attention call sit, in absolute positions.
struct TORCHPATCH_API MaskLayout {
  int64_t batch;
  int64_t q_len;     ///< queries at past_len .. past_len+q_len-1
  int64_t past_len;  ///< tokens before the queries
  MaskSizes kv;      ///< keys at kv.offset .. kv.offset+kv.length-1
  std::optional<int64_t> sliding_window;  ///< a query at i sees keys j with i-window < j <= i
};

/// The mask of one attention call: causal, optionally sliding, AND `padding_mask` [B, past+Q]
/// (1 = real token) when defined. Undefined when it would mask nothing (one query, no padding, all
/// keys inside the window), so decoding skips the addition. `options`: the mask's dtype and device
/// (a dtype alone: the CPU).
TORCHPATCH_API at::Tensor attention_mask(const at::Tensor& padding_mask, const MaskLayout& layout,
                                         at::TensorOptions options);

/// Causal mask for `q_len` queries at absolute positions past_len .. past_len+q_len-1 over
/// past_len+q_len keys, combined with `padding_mask` [B, KV] (1 = real token) when defined.
TORCHPATCH_API at::Tensor causal_mask(const at::Tensor& padding_mask, int64_t batch, int64_t q_len, int64_t past_len,
                                      at::TensorOptions options);

/// Padding-only mask of an encoder (BERT): [B, 1, 1, KV] from `padding_mask` [B, KV] (1 = real
/// token), every query seeing every real key. Undefined when there is no padding to mask.
TORCHPATCH_API at::Tensor bidirectional_mask(const at::Tensor& padding_mask, at::TensorOptions options);

}  // namespace torchpatch::nn
