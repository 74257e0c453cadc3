// GGUF's Q8_0 / Q4_0 blocks on CUDA (nn/cuda/quant_kernels.h). Blocks are 34 and 18 bytes, so they are
// only 2-byte aligned: everything is read as 16-bit words.
#include "nn/cuda/quant_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace torchpatch::nn::cuda {
namespace {

constexpr int kBlock = 32;
constexpr int kWarpsPerCta = 4;

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float(float v) { return v; }
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16(v); }
template <>
__device__ __forceinline__ __half from_float(float v) { return __float2half(v); }

__device__ __forceinline__ float block_scale(const uint16_t* block) {
  return __half2float(__ushort_as_half(block[0]));
}

// The 32 quants of a block as signed values, in GGUF's order (Q4_0: low nibbles are 0..15, high 16..31).
template <bool kQ4>
__device__ __forceinline__ void block_quants(const uint16_t* block, int q[kBlock]) {
  if constexpr (kQ4) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint16_t two = block[1 + j];  // bytes 2j and 2j+1 of the quants
      q[2 * j] = (two & 0xF) - 8;
      q[2 * j + 16] = ((two >> 4) & 0xF) - 8;
      q[2 * j + 1] = ((two >> 8) & 0xF) - 8;
      q[2 * j + 17] = (two >> 12) - 8;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint16_t two = block[1 + j];
      q[2 * j] = static_cast<int8_t>(two & 0xFF);
      q[2 * j + 1] = static_cast<int8_t>(two >> 8);
    }
  }
}

template <bool kQ4, typename T, int kTokens>
__global__ void quant_gemv(const uint8_t* __restrict__ blocks, const T* __restrict__ x, T* __restrict__ y,
                           const T* __restrict__ bias, int64_t rows, int64_t in_features, int tokens) {
  constexpr int kBytes = kQ4 ? 18 : 34;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + threadIdx.y;
  if (row >= rows) return;
  const int lane = threadIdx.x;
  const int64_t per_row = in_features / kBlock;
  const uint8_t* w = blocks + row * per_row * kBytes;
  float acc[kTokens];
#pragma unroll
  for (int m = 0; m < kTokens; ++m) acc[m] = 0.f;
  for (int64_t b = lane; b < per_row; b += 32) {
    const auto* block = reinterpret_cast<const uint16_t*>(w + b * kBytes);
    int q[kBlock];
    block_quants<kQ4>(block, q);
    const float d = block_scale(block);
#pragma unroll
    for (int m = 0; m < kTokens; ++m) {
      if (m >= tokens) break;
      const T* xs = x + m * in_features + b * kBlock;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kBlock; ++j) sum += static_cast<float>(q[j]) * to_float(xs[j]);
      acc[m] += d * sum;
    }
  }
#pragma unroll
  for (int m = 0; m < kTokens; ++m) {
    if (m >= tokens) break;
    float v = acc[m];
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
    if (lane == 0) y[m * rows + row] = from_float<T>(v + (bias ? to_float(bias[row]) : 0.f));
  }
}

template <bool kQ4, typename T>
__global__ void dequantize_blocks(const uint8_t* __restrict__ blocks, T* __restrict__ out, int64_t count) {
  constexpr int kBytes = kQ4 ? 18 : 34;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= count) return;
  const auto* block = reinterpret_cast<const uint16_t*>(blocks + b * kBytes);
  int q[kBlock];
  block_quants<kQ4>(block, q);
  const float d = block_scale(block);
  T* dst = out + b * kBlock;
#pragma unroll
  for (int j = 0; j < kBlock; ++j) dst[j] = from_float<T>(d * static_cast<float>(q[j]));
}

template <bool kQ4, typename T, int kTokens>
void gemv_for(const uint8_t* blocks, const void* x, void* y, const void* bias, int64_t rows, int64_t in_features,
              int tokens, cudaStream_t stream) {
  const dim3 threads(32, kWarpsPerCta);
  const dim3 grid(static_cast<unsigned>((rows + kWarpsPerCta - 1) / kWarpsPerCta));
  quant_gemv<kQ4, T, kTokens><<<grid, threads, 0, stream>>>(blocks, static_cast<const T*>(x), static_cast<T*>(y),
                                                            static_cast<const T*>(bias), rows, in_features, tokens);
}

// The token count is a template argument, so the accumulators stay in registers.
template <bool kQ4, typename T>
void gemv_tokens(int tokens, const uint8_t* blocks, const void* x, void* y, const void* bias, int64_t rows,
                 int64_t in_features, cudaStream_t stream) {
  switch (tokens) {
    case 1: return gemv_for<kQ4, T, 1>(blocks, x, y, bias, rows, in_features, tokens, stream);
    case 2: return gemv_for<kQ4, T, 2>(blocks, x, y, bias, rows, in_features, tokens, stream);
    case 3: return gemv_for<kQ4, T, 3>(blocks, x, y, bias, rows, in_features, tokens, stream);
    case 4: return gemv_for<kQ4, T, 4>(blocks, x, y, bias, rows, in_features, tokens, stream);
    default: return gemv_for<kQ4, T, kMaxGemvTokens>(blocks, x, y, bias, rows, in_features, tokens, stream);
  }
}

template <typename T>
void gemv_typed(bool q4_0, int tokens, const uint8_t* blocks, const void* x, void* y, const void* bias, int64_t rows,
                int64_t in_features, cudaStream_t stream) {
  if (q4_0) return gemv_tokens<true, T>(tokens, blocks, x, y, bias, rows, in_features, stream);
  return gemv_tokens<false, T>(tokens, blocks, x, y, bias, rows, in_features, stream);
}

template <typename T>
void dequantize_typed(bool q4_0, const uint8_t* blocks, void* out, int64_t count, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const unsigned grid = static_cast<unsigned>((count + kThreads - 1) / kThreads);
  if (q4_0) return dequantize_blocks<true, T><<<grid, kThreads, 0, stream>>>(blocks, static_cast<T*>(out), count);
  dequantize_blocks<false, T><<<grid, kThreads, 0, stream>>>(blocks, static_cast<T*>(out), count);
}

}  // namespace

void launch_quant_gemv(bool q4_0, const uint8_t* blocks, const void* x, void* y, const void* bias, int64_t rows,
                       int64_t in_features, int tokens, Element element, cudaStream_t stream) {
  // 5..8 tokens run the 8-token kernel, which stops at `tokens`.
  switch (element) {
    case Element::kFloat: return gemv_typed<float>(q4_0, tokens, blocks, x, y, bias, rows, in_features, stream);
    case Element::kBFloat16:
      return gemv_typed<__nv_bfloat16>(q4_0, tokens, blocks, x, y, bias, rows, in_features, stream);
    case Element::kHalf: return gemv_typed<__half>(q4_0, tokens, blocks, x, y, bias, rows, in_features, stream);
  }
}

void launch_dequantize(bool q4_0, const uint8_t* blocks, void* out, int64_t rows, int64_t in_features, Element element,
                       cudaStream_t stream) {
  const int64_t count = rows * (in_features / kBlock);
  switch (element) {
    case Element::kFloat: return dequantize_typed<float>(q4_0, blocks, out, count, stream);
    case Element::kBFloat16: return dequantize_typed<__nv_bfloat16>(q4_0, blocks, out, count, stream);
    case Element::kHalf: return dequantize_typed<__half>(q4_0, blocks, out, count, stream);
  }
}

}  // namespace torchpatch::nn::cuda
