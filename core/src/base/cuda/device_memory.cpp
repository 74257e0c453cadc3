// libtorchpatch_cuda's part of base/device: how much memory a CUDA device has, from the CUDA runtime.
#include <cuda_runtime_api.h>

#include "base/cuda_library.h"

namespace torchpatch {
namespace {

double memory_bytes(c10::Device device) {
  int index = device.index();  // -1 for "cuda": the current GPU, asked for below
  cudaDeviceProp properties{};
  if ((index < 0 && cudaGetDevice(&index) != cudaSuccess) || cudaGetDeviceProperties(&properties, index) != cudaSuccess) {
    (void)cudaGetLastError();  // not left for the next CUDA call to report
    return 0;
  }
  return static_cast<double>(properties.totalGlobalMem);
}

const bool registered = (register_cuda_memory_query(&memory_bytes), true);

}  // namespace
}  // namespace torchpatch
