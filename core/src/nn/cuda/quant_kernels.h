// Internal: the CUDA kernels of GGUF's Q8_0 / Q4_0 blocks (nn/quant.h), with plain pointers so that
// they compile with nvcc alone, without LibTorch's headers. nn/cuda/quant_cuda.cpp hands them tensors.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace torchpatch::nn::cuda {

/// The element types activations and results may have.
enum class Element { kFloat, kBFloat16, kHalf };

/// y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]) for m < tokens <= kMaxGemvTokens, reading W's GGUF
/// blocks (`q4_0` or Q8_0, row after row) straight from memory: one warp per output row, each lane a
/// block at a time, every row read once for all tokens. Sums in float32; x, y, bias of type `element`.
constexpr int kMaxGemvTokens = 8;
void launch_quant_gemv(bool q4_0, const uint8_t* blocks, const void* x, void* y, const void* bias, int64_t rows,
                       int64_t in_features, int tokens, Element element, cudaStream_t stream);

/// The weights W [rows, in_features] that the blocks stand for, as `element`: d * q (Q8_0),
/// d * (q - 8) (Q4_0); one thread per block. Exact in float32 (an fp16 times a small integer).
void launch_dequantize(bool q4_0, const uint8_t* blocks, void* out, int64_t rows, int64_t in_features, Element element,
                       cudaStream_t stream);

}  // namespace torchpatch::nn::cuda
