// Prefill is matrix products. The system OpenBLAS runs its AVX2 kernels here (OPENBLAS_CORETYPE is
// pinned), half of what a core with full-width AVX-512 can do; oneDNN, which LibTorch already loads,
// picks its kernels from the CPU it finds and ran llama-125m's products 1.6-2.0x faster at one thread
// (docs/quantization.md, "Float32 prefill"). oneDNN's own threading split some of these shapes badly
// (a [16, 2048] x [2048, 768] product ran slower on two threads than on one), so the columns are split
// here: each thread one sgemm on its share of the weight's rows.
#include "nn/gemm.h"

#if defined(TORCHPATCH_ONEDNN_GEMM)  // core/CMakeLists.txt says when
#include <dnnl.h>

#include <algorithm>
#include <stdexcept>

#include <ATen/Parallel.h>
#include <fmt/format.h>

namespace torchpatch::nn {

namespace {
constexpr int64_t kColumnGroup = 16;  // one AVX-512 register of outputs: parts start on a group
}  // namespace

void onednn_gemm(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k) {
  const int64_t groups = (n + kColumnGroup - 1) / kColumnGroup;
#if defined(_OPENMP)
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), groups));
#else  // at::parallel_for runs serially in this build: one sgemm, threaded by oneDNN itself
  const int64_t parts = 1;
#endif
  at::parallel_for(0, parts, 1, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const int64_t begin = std::min(n, groups * p / parts * kColumnGroup);
      const int64_t end = std::min(n, groups * (p + 1) / parts * kColumnGroup);
      if (begin == end) continue;
      // Row-major: y[:, begin:end] = x W[begin:end]^T.
      const auto status = dnnl_sgemm('N', 'T', m, end - begin, k, 1.0f, x, k, w + begin * k, k, 0.0f, y + begin, n);
      if (status != dnnl_success) {
        throw std::runtime_error(fmt::format("oneDNN sgemm [{}, {}] x [{}, {}]^T failed with status {}", m, k,
                                             end - begin, k, static_cast<int>(status)));
      }
    }
  });
}

}  // namespace torchpatch::nn

#endif  // TORCHPATCH_ONEDNN_GEMM
