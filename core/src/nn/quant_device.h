// Internal: Q8_0 / Q4_0 products and dequantization of tensors on a CUDA device (nn/cuda/quant_cuda.cpp),
// or, in a build without CUDA, an error that says so.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "torchpatch/error.h"
#include "torchpatch/nn/quant.h"

namespace torchpatch::nn {

#if defined(TORCHPATCH_WITH_CUDA)
/// quant_linear for x (float32, bfloat16 or float16) and kBlocks-laid blocks on one CUDA device: the
/// result has x's dtype. Up to 8 tokens read the blocks directly; more are multiplied by cuBLAS with
/// the weights dequantized to x's dtype.
at::Tensor cuda_quant_linear(QuantFormat format, const at::Tensor& x, const at::Tensor& blocks, int64_t out_features,
                             const at::Tensor& bias);
/// dequantize for blocks on a CUDA device, once dequantize has checked them (uint8 rows of whole
/// blocks): float32 on that device.
at::Tensor cuda_dequantize(QuantFormat format, const at::Tensor& blocks, const std::string& name);
#else
inline at::Tensor cuda_quant_linear(QuantFormat, const at::Tensor&, const at::Tensor&, int64_t, const at::Tensor&) {
  throw InputError("quantized product on a CUDA tensor: this torchpatch was built without CUDA (TORCHPATCH_CUDA=OFF)");
}
inline at::Tensor cuda_dequantize(QuantFormat, const at::Tensor&, const std::string& name) {
  throw InputError("tensor '" + name + "' is on a CUDA device: this torchpatch was built without CUDA (TORCHPATCH_CUDA=OFF)");
}
#endif

}  // namespace torchpatch::nn
