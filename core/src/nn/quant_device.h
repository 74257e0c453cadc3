// Internal: Q8_0 / Q4_0 products and dequantization of tensors on a CUDA device. The kernels live in
// libtorchpatch_cuda (nn/cuda/quant_cuda.cpp), which registers them here as it loads
// (base/cuda_library.h); in a build without CUDA these are errors that say so.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "torchpatch/nn/quant.h"

namespace torchpatch::nn {

/// The CUDA entry points libtorchpatch_cuda provides.
struct QuantCudaKernels {
  /// quant_linear for x (float32, bfloat16 or float16) and kBlocks-laid blocks on one CUDA device: the
  /// result has x's dtype. Up to 8 tokens read the blocks directly; more are multiplied by cuBLAS with
  /// the weights dequantized to x's dtype.
  at::Tensor (*linear)(QuantFormat format, const at::Tensor& x, const at::Tensor& blocks, int64_t out_features,
                       const at::Tensor& bias) = nullptr;
  /// dequantize for blocks on a CUDA device, once dequantize has checked them (uint8 rows of whole
  /// blocks): float32 on that device.
  at::Tensor (*dequantize)(QuantFormat format, const at::Tensor& blocks, const std::string& name) = nullptr;
};

/// Called by libtorchpatch_cuda as it loads.
void register_quant_cuda_kernels(const QuantCudaKernels& kernels);

/// QuantCudaKernels::linear, loading libtorchpatch_cuda if no GPU was asked for yet.
at::Tensor cuda_quant_linear(QuantFormat format, const at::Tensor& x, const at::Tensor& blocks, int64_t out_features,
                             const at::Tensor& bias);
/// QuantCudaKernels::dequantize, likewise.
at::Tensor cuda_dequantize(QuantFormat format, const at::Tensor& blocks, const std::string& name);

}  // namespace torchpatch::nn
