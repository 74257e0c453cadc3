#include "nn/quant_device.h"

#include "base/cuda_library.h"

namespace torchpatch::nn {
namespace {

QuantCudaKernels registered;

// Through load_cuda_library every time (after the first, one check of a flag): it orders this read
// after the registration made while the library loaded, on whichever thread loaded it.
const QuantCudaKernels& kernels() {
  load_cuda_library();
  return registered;
}

}  // namespace

void register_quant_cuda_kernels(const QuantCudaKernels& kernels) { registered = kernels; }

at::Tensor cuda_quant_linear(QuantFormat format, const at::Tensor& x, const at::Tensor& blocks, int64_t out_features,
                             const at::Tensor& bias) {
  return kernels().linear(format, x, blocks, out_features, bias);
}

at::Tensor cuda_dequantize(QuantFormat format, const at::Tensor& blocks, const std::string& name) {
  return kernels().dequantize(format, blocks, name);
}

}  // namespace torchpatch::nn
