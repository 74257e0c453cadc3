#include "torchpatch/nn/masks.h"

#include <limits>

#include <ATen/ATen.h>

namespace torchpatch::nn {

at::Tensor causal_mask(const at::Tensor& padding_mask, int64_t batch, int64_t q_len, int64_t past_len,
                       c10::ScalarType dtype) {
  const int64_t kv_len = past_len + q_len;
  auto q_idx = at::arange(past_len, kv_len, at::kLong).unsqueeze(1);  // [Q, 1]
  auto kv_idx = at::arange(0, kv_len, at::kLong).unsqueeze(0);        // [1, KV]
  auto allowed = (kv_idx <= q_idx).unsqueeze(0).unsqueeze(0);         // [1, 1, Q, KV]
  if (padding_mask.defined()) {
    auto keep = padding_mask.to(at::kBool).view({batch, 1, 1, kv_len});
    allowed = allowed.logical_and(keep);
  } else {
    allowed = allowed.expand({batch, 1, q_len, kv_len});
  }
  const double lowest = dtype == at::kDouble ? std::numeric_limits<double>::lowest()
                        : dtype == at::kBFloat16 ? -3.3895313892515355e38
                        : dtype == at::kHalf     ? -65504.0
                                                 : static_cast<double>(std::numeric_limits<float>::lowest());
  auto mask = at::zeros({batch, 1, q_len, kv_len}, at::TensorOptions().dtype(dtype));
  return mask.masked_fill(allowed.logical_not(), lowest);
}

}  // namespace torchpatch::nn
