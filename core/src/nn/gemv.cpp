// Decoding one token reads every weight once, so its speed is memory bandwidth. OpenBLAS's sgemv
// keeps few loads in flight and reaches about half of what one core can stream here. These kernels
// take one row at a time with four independent accumulators: consecutive rows are one sequential
// stream, the case the hardware prefetcher serves best. In the whole model that beat four rows at a
// time with software prefetch (four streams) by 8-10% at one thread and 15-30% at two
// (docs/quantization.md, "The decode step").
#include "nn/gemv.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "base/cpu_level.h"
#include "base/parallel.h"
#include "base/x86_intrinsics.h"

namespace torchpatch::nn {

#if defined(__x86_64__)

namespace {

constexpr int64_t kRowsPerTask = 128;  // 384 KiB of weights at k = 768

// One row of W times x.
__attribute__((target("avx512f"))) float row_avx512(const float* w, const float* x, int64_t k) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= k; i += 64) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), acc1);
    acc2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 32), _mm512_loadu_ps(x + i + 32), acc2);
    acc3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 48), _mm512_loadu_ps(x + i + 48), acc3);
  }
  for (; i < k; i += 16) {
    const __mmask16 m = k - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (k - i)) - 1);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_maskz_loadu_ps(m, x + i), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

__attribute__((target("avx2,fma"))) float row_avx2(const float* w, const float* x, int64_t k) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), acc3);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  float sum = 0;
  for (float lane : lanes) sum += lane;
  for (; i < k; ++i) sum += w[i] * x[i];
  return sum;
}

}  // namespace

DecodeKernel resolve_decode_kernel(DecodeKernel choice) {
  static const bool avx512 = __builtin_cpu_supports("avx512f") && base::cpu_level_allowed(base::CpuLevel::kAvx512);
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           base::cpu_level_allowed(base::CpuLevel::kAvx2);
  switch (choice) {
    case DecodeKernel::kAuto: return avx512 ? DecodeKernel::kAvx512 : avx2 ? DecodeKernel::kAvx2 : DecodeKernel::kBlas;
    case DecodeKernel::kAvx512: return avx512 ? DecodeKernel::kAvx512 : DecodeKernel::kBlas;
    case DecodeKernel::kAvx2: return avx2 ? DecodeKernel::kAvx2 : DecodeKernel::kBlas;
    default: return DecodeKernel::kBlas;
  }
}

void fast_gemv(DecodeKernel kernel, const float* w, const float* x, float* y, int64_t n, int64_t k) {
  const auto row = kernel == DecodeKernel::kAvx512 ? row_avx512 : row_avx2;
  // x read from 16 bytes past a 64-byte boundary. With x aligned as the weight's rows are (LibTorch
  // aligns both to 64 bytes) the gemv over llama-125m's weights read 19-21 GB/s here; with x 4 to 16
  // bytes off, 22-26 (the same process, alternated; docs/quantization.md, "The decode step"). Which
  // part of the core makes the difference was not pinned down; the copy is a few KB against MBs.
  thread_local std::vector<float> moved;
  moved.resize(static_cast<std::size_t>(k) + 16 + 4);
  const auto aligned = (reinterpret_cast<std::uintptr_t>(moved.data()) + 63) & ~std::uintptr_t{63};
  float* shifted = reinterpret_cast<float*>(aligned) + 4;
  std::copy(x, x + k, shifted);
  base::parallel_for(0, n, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) y[r] = row(w + r * k, shifted, k);
  });
}

#else  // no vector kernels on this architecture: LibTorch's BLAS serves every product

DecodeKernel resolve_decode_kernel(DecodeKernel) { return DecodeKernel::kBlas; }
void fast_gemv(DecodeKernel, const float*, const float*, float*, int64_t, int64_t) {}

#endif

}  // namespace torchpatch::nn
