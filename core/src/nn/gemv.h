// Internal: a matrix-vector product for decoding, y[N] = W[N, K] x[K] (float32, W row-major).
#pragma once

#include <cstdint>

namespace torchpatch::nn {

/// True when this CPU has a vector kernel for `fast_gemv` (AVX-512F or AVX2 with FMA).
bool fast_gemv_supported();

/// y = W x over rows [0, N), split across LibTorch's intra-op threads. Requires fast_gemv_supported().
void fast_gemv(const float* w, const float* x, float* y, int64_t n, int64_t k);

}  // namespace torchpatch::nn
