// Internal: a matrix-vector product for decoding, y[N] = W[N, K] x[K] (float32, W row-major).
#pragma once

#include <cstdint>

#include "torchpatch/nn/linear.h"

namespace torchpatch::nn {

/// The vector kernel `fast_gemv` would run for `choice` on this CPU (kBlas when it has none).
DecodeKernel resolve_decode_kernel(DecodeKernel choice);

/// y = W x over rows [0, n), split across LibTorch's intra-op threads, with `kernel` (kAvx512 or
/// kAvx2, as resolved above).
void fast_gemv(DecodeKernel kernel, const float* w, const float* x, float* y, int64_t n, int64_t k);

}  // namespace torchpatch::nn
