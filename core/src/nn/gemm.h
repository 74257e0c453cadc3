// Internal: float32 matrix products of several rows (prefill, batches), y[M, N] = x[M, K] W[N, K]^T.
#pragma once

#include <cstdint>

namespace torchpatch::nn {

#if defined(TORCHPATCH_ONEDNN_GEMM)
constexpr bool kHaveOneDnnGemm = true;
#else
constexpr bool kHaveOneDnnGemm = false;  // LibTorch 2.x: its own products (core/CMakeLists.txt)
#endif

/// y = x W^T with oneDNN's sgemm, the output columns split in equal parts over LibTorch's intra-op
/// threads (each part one single-threaded sgemm, so a column's sum is the same at any thread count).
/// Built without OpenMP (the clang sanitizer builds), it is one sgemm on oneDNN's own threads.
/// x [m, k], W [n, k] and y [m, n] are row-major and contiguous. Throws when oneDNN refuses.
void onednn_gemm(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k);

}  // namespace torchpatch::nn
