// Internal: what the kernels that read kRows16 weights (nn/quant.h) share: the activations as they
// take them, and the AVX2 kernels (quant_rows16_avx2.cpp; the AVX-512 ones are in quant_kernels.cpp).
#pragma once

#include <cstdint>

namespace torchpatch::nn::rows16 {

/// Activations per token in Q8_0: q [t * blocks * 32 ...], and per block its scale and the int32 a
/// block's sum starts from, [t * blocks + b]: minus the weights' offset times the block's sum of q
/// where the kernel multiplies the weights unsigned (Q4_0's nibbles: -8 sum; AVX-512's Q8_0, w + 128:
/// -128 sum), 0 where it multiplies them signed (AVX2's Q8_0).
struct RowTokens {
  int64_t blocks;
  const int8_t* q;
  const float* d;
  const int32_t* init;
};

/// The activations' Q8_0 blocks with AVX2: the same q, d and sums as the scalar quantize_activations
/// (quant_kernels.cpp), bit for bit: d = amax / 127, q = x * (127 / amax) rounded to nearest even,
/// clamped to +-127, NaN as 0.
void quantize_activations_avx2(const float* x, int64_t k, int8_t* q, float* d, int32_t* sum);

/// Rows [row_begin, row_end) of a kRows16 product, whole groups of 16 (row_begin a multiple of 16),
/// for every token with AVX2: y[t * out_features + o] (plus bias[o]). A token's outputs are the same
/// whatever the number of tokens.
void product_avx2(bool q8, const uint8_t* w, int64_t row_bytes, const RowTokens& x, int64_t tokens, int64_t row_begin,
                  int64_t row_end, float* y, int64_t out_features, const float* bias);

}  // namespace torchpatch::nn::rows16
