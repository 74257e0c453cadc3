// Checks on a shape read from a file, before LibTorch is asked to lay a tensor out in it.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace torchpatch {

/// Whether LibTorch can lay out a contiguous tensor of this shape: every stride, the product of the
/// dimensions after it counting an empty dimension as one, must fit an int64. An empty tensor needs no
/// bytes, yet [0, 2^40, 2^40] is still refused by at::empty with a c10::Error.
inline bool strides_fit_int64(const std::vector<int64_t>& shape) {
  uint64_t extent = 1;
  for (const int64_t d : shape) {
    const auto factor = static_cast<uint64_t>(d > 1 ? d : 1);
    if (__builtin_mul_overflow(extent, factor, &extent) ||
        extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return false;
    }
  }
  return true;
}

}  // namespace torchpatch
