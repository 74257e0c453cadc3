// Decoding one token reads every weight once, so its speed is memory bandwidth. OpenBLAS's sgemv
// keeps few loads in flight and reaches about half of what one core can stream here; these kernels
// walk four rows at once and prefetch the next four, which keeps the memory system busy. Four rows
// read about 0.95 of a plain sum over the same bytes on the benchmark machine, eight rows 0.85 and
// one row 0.9 (docs/quantization.md, "The decode step").
#include "nn/gemv.h"

#include <algorithm>
#include <cstdint>

#include <ATen/Parallel.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace torchpatch::nn {

#if defined(__x86_64__)

namespace {

constexpr int kRows = 4;             // rows per block: four independent accumulators
constexpr int64_t kPrefetchBytes = 2048;  // how far past the next block's matching line to prefetch

// ROWS consecutive rows of W times x. ROWS is a compile-time constant so the accumulators stay in
// registers and the row loop unrolls.
template <int ROWS>
__attribute__((target("avx512f"))) void rows_avx512(const float* w, const float* x, float* y, int64_t k,
                                                     const char* next) {
  __m512 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    const __m512 xv = _mm512_loadu_ps(x + i);
    for (int r = 0; r < ROWS; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(w + r * k + i), xv, acc[r]);
      _mm_prefetch(next + (r * k + i) * 4, _MM_HINT_T0);
    }
  }
  if (i < k) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (k - i)) - 1);
    const __m512 xv = _mm512_maskz_loadu_ps(tail, x + i);
    for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w + r * k + i), xv, acc[r]);
  }
  for (int r = 0; r < ROWS; ++r) y[r] = _mm512_reduce_add_ps(acc[r]);
}

template <int ROWS>
__attribute__((target("avx2,fma"))) void rows_avx2(const float* w, const float* x, float* y, int64_t k,
                                                  const char* next) {
  __m256 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {  // two vectors per step: one prefetch per 64-byte line
    const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
    for (int r = 0; r < ROWS; ++r) {
      acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * k + i), x0, acc[r]);
      acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * k + i + 8), x1, acc[r]);
      _mm_prefetch(next + (r * k + i) * 4, _MM_HINT_T0);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc[r]);
    float sum = 0;
    for (float lane : lanes) sum += lane;
    for (int64_t j = i; j < k; ++j) sum += w[r * k + j] * x[j];
    y[r] = sum;
  }
}

template <int ROWS>
void rows(bool wide, const float* w, const float* x, float* y, int64_t k, const char* next) {
  if (wide) {
    rows_avx512<ROWS>(w, x, y, k, next);
  } else {
    rows_avx2<ROWS>(w, x, y, k, next);
  }
}

}  // namespace

DecodeKernel resolve_decode_kernel(DecodeKernel choice) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  switch (choice) {
    case DecodeKernel::kAuto: return avx512 ? DecodeKernel::kAvx512 : avx2 ? DecodeKernel::kAvx2 : DecodeKernel::kBlas;
    case DecodeKernel::kAvx512: return avx512 ? DecodeKernel::kAvx512 : DecodeKernel::kBlas;
    case DecodeKernel::kAvx2: return avx2 ? DecodeKernel::kAvx2 : DecodeKernel::kBlas;
    default: return DecodeKernel::kBlas;
  }
}

void fast_gemv(DecodeKernel kernel, const float* w, const float* x, float* y, int64_t n, int64_t k) {
  const int64_t blocks = (n + kRows - 1) / kRows;
  const bool wide = kernel == DecodeKernel::kAvx512;
  const auto end_of_weight = reinterpret_cast<std::uintptr_t>(w + n * k);
  // Each thread takes whole blocks of rows, 32 blocks at least: 128 rows, 384 KiB of weights at k = 768.
  at::parallel_for(0, blocks, 32, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t row = b * kRows;
      const float* block = w + row * k;
      // Prefetch addresses are computed as integers: the last blocks' run past the weight (the
      // instruction never faults, but pointer arithmetic past an array's end is undefined).
      const auto ahead = reinterpret_cast<std::uintptr_t>(block) + kRows * k * sizeof(float) + kPrefetchBytes;
      const char* next = reinterpret_cast<const char*>(ahead < end_of_weight ? ahead : reinterpret_cast<std::uintptr_t>(block));
      if (row + kRows <= n) {
        rows<kRows>(wide, block, x, y + row, k, next);
      } else {
        for (int64_t r = row; r < n; ++r) rows<1>(wide, w + r * k, x, y + r, k, next);
      }
    }
  });
}

#else  // no vector kernels on this architecture: LibTorch's BLAS serves every product

DecodeKernel resolve_decode_kernel(DecodeKernel) { return DecodeKernel::kBlas; }
void fast_gemv(DecodeKernel, const float*, const float*, float*, int64_t, int64_t) {}

#endif

}  // namespace torchpatch::nn
