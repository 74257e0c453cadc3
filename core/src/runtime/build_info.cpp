#include "torchpatch/runtime/build_info.h"

#include <vector>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join
#include <torch/csrc/api/include/torch/version.h>

#include "torchpatch/device.h"
#include "torchpatch/nn/quant.h"
#include "torchpatch/version.h"

namespace torchpatch {

std::string build_info() {
  std::vector<std::string> features;
  // The extensions the float32 decode kernels (gemv, decode attention) and the quantized kernels test for.
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) features.emplace_back("AVX2+FMA");
  if (__builtin_cpu_supports("avx512f")) features.emplace_back("AVX-512F");
  if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) features.emplace_back("AVX-512BW/VL");
  const bool rows16 = nn::preferred_quant_layout() == nn::QuantLayout::kRows16;
  return fmt::format(
      "torchpatch {}.{}.{}\n"
      "LibTorch {}.{}.{} (CPU; intra-op threads: {})\n"
      "CUDA: {}\n"
      "CPU extensions in use: {}\n"
      "quantized kernels: {}\n",
      TORCHPATCH_VERSION_MAJOR, TORCHPATCH_VERSION_MINOR, TORCHPATCH_VERSION_PATCH, TORCH_VERSION_MAJOR,
      TORCH_VERSION_MINOR, TORCH_VERSION_PATCH, at::get_num_threads(),
      // Said without loading it: the CUDA libraries load only when a command asks for a GPU.
      cuda_built() ? "built (libtorchpatch_cuda, loaded when a command asks for a GPU)" : "not built (CPU only)",
      features.empty() ? "none (LibTorch's own kernels only)" : fmt::format("{}", fmt::join(features, ", ")),
      rows16 ? "the kRows16 layout (AVX-512 VNNI)" : "the kBlocks layout (GGUF's own)");
}

}  // namespace torchpatch
