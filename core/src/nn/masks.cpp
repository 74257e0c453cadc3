#include "torchpatch/nn/masks.h"

#include <limits>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/error.h"

namespace torchpatch::nn {

namespace {
double lowest(c10::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble: return std::numeric_limits<double>::lowest();
    case at::kBFloat16: return -3.3895313892515355e38;
    case at::kHalf: return -65504.0;
    default: return static_cast<double>(std::numeric_limits<float>::lowest());
  }
}
}  // namespace

at::Tensor attention_mask(const at::Tensor& padding_mask, const MaskLayout& layout, at::TensorOptions options) {
  const auto dtype = c10::typeMetaToScalarType(options.dtype());
  const auto& [batch, q_len, past_len, kv, window] = layout;
  if (padding_mask.defined() && (padding_mask.dim() != 2 || padding_mask.size(0) != batch ||
                                 padding_mask.size(1) != past_len + q_len)) {
    throw InputError(fmt::format("attention_mask: expected [{}, {}] (batch, cached + new tokens), got {}", batch,
                                 past_len + q_len, fmt::join(padding_mask.sizes(), "x")));
  }
  const bool window_covers_all = !window || kv.length <= *window;
  if (!padding_mask.defined() && q_len == 1 && window_covers_all) return {};

  auto q_idx = at::arange(past_len, past_len + q_len, options.dtype(at::kLong)).unsqueeze(1);             // [Q, 1]
  auto kv_idx = at::arange(kv.offset, kv.offset + kv.length, options.dtype(at::kLong)).unsqueeze(0);  // [1, KV]
  auto allowed = kv_idx <= q_idx;                                                  // [Q, KV]
  if (window) allowed = allowed.logical_and(kv_idx > q_idx - *window);
  allowed = allowed.view({1, 1, q_len, kv.length});
  if (padding_mask.defined()) {
    auto keep = padding_mask.narrow(1, kv.offset, kv.length).to(at::kBool).view({batch, 1, 1, kv.length});
    allowed = allowed.logical_and(keep);
  } else {
    allowed = allowed.expand({batch, 1, q_len, kv.length});
  }
  auto mask = at::zeros({batch, 1, q_len, kv.length}, options);
  return mask.masked_fill(allowed.logical_not(), lowest(dtype));
}

at::Tensor causal_mask(const at::Tensor& padding_mask, int64_t batch, int64_t q_len, int64_t past_len,
                       at::TensorOptions options) {
  const MaskLayout layout{batch, q_len, past_len, MaskSizes{past_len + q_len, 0}, std::nullopt};
  auto mask = attention_mask(padding_mask, layout, options);
  if (!mask.defined()) mask = at::zeros({batch, 1, q_len, past_len + q_len}, options);
  return mask;
}

at::Tensor bidirectional_mask(const at::Tensor& padding_mask, at::TensorOptions options) {
  const auto dtype = c10::typeMetaToScalarType(options.dtype());
  if (!padding_mask.defined()) return {};
  if (padding_mask.dim() != 2) {
    throw InputError(fmt::format("attention_mask: expected [batch, keys], got {}", fmt::join(padding_mask.sizes(), "x")));
  }
  const auto keep = padding_mask.to(at::kBool);
  if (keep.all().item<bool>()) return {};
  auto mask = at::zeros({padding_mask.size(0), 1, 1, padding_mask.size(1)}, options.device(padding_mask.device()));
  return mask.masked_fill(keep.logical_not().view(mask.sizes()), lowest(dtype));
}

}  // namespace torchpatch::nn
