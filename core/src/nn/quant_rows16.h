// Internal: what the kernels that read kRows16 weights (nn/quant.h) share: the activations as they
// take them, and the AVX2 kernels (quant_rows16_avx2.cpp; the AVX-512 ones are in quant_kernels.cpp).
#pragma once

#include <algorithm>
#include <cstdint>

#include "torchpatch/nn/quant.h"

namespace torchpatch::nn::rows16 {

/// Activations per token in Q8_0: q [t * blocks * 32 ...], and per block its scale and the int32 a
/// block's sum starts from, [t * blocks + b]: minus the weights' offset times the block's sum of q
/// where the kernel multiplies the weights unsigned (Q4_0's nibbles: -8 sum; AVX-512's Q8_0, w + 128:
/// -128 sum), 0 where it multiplies them signed (AVX2's Q8_0) or the offset is stored (Q4_1). For
/// Q4_1, `x_sum` is d times the block's sum of q: what the rows' stored offset m multiplies.
struct RowTokens {
  int64_t blocks;
  const int8_t* q;
  const float* d;
  const int32_t* init;
  const float* x_sum = nullptr;
};

/// Every group of 16 rows in [row_begin, row_end) times every token, `step` tokens at a time:
/// run(group, x_t, out, bias, n) with x_t the n <= step tokens from t on and out = y + t * out_features
/// + o. Tokens go in chunks whose activations (32 bytes of q, a scale and an init per block) stay
/// within `cache_bytes`, so a group's rows, once in cache, serve every token of a chunk.
template <class Run>
void for_groups_and_tokens(const uint8_t* w, int64_t row_bytes, const RowTokens& x, int64_t tokens, int64_t row_begin,
                           int64_t row_end, float* y, int64_t out_features, const float* bias, int64_t step,
                           int64_t cache_bytes, const Run& run) {
  constexpr int64_t kRows = 16, kBlockWeights = 32;
  const int64_t token_bytes = x.blocks * (kBlockWeights + 8);
  const int64_t chunk = std::max<int64_t>(step, cache_bytes / token_bytes / step * step);
  for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
    const int64_t t1 = std::min(tokens, t0 + chunk);
    for (int64_t o = row_begin; o < row_end; o += kRows) {
      for (int64_t t = t0; t < t1; t += step) {
        const RowTokens xt{x.blocks, x.q + t * x.blocks * kBlockWeights, x.d + t * x.blocks, x.init + t * x.blocks,
                           x.x_sum != nullptr ? x.x_sum + t * x.blocks : nullptr};
        run(w + o * row_bytes, xt, y + t * out_features + o, bias ? bias + o : nullptr, std::min(step, t1 - t));
      }
    }
  }
}

/// The activations' Q8_0 blocks with AVX2: the same q, d and sums as the scalar quantize_activations
/// (quant_kernels.cpp), bit for bit: d = amax / 127, q = x * (127 / amax) rounded to nearest even,
/// clamped to +-127, NaN as 0.
void quantize_activations_avx2(const float* x, int64_t k, int8_t* q, float* d, int32_t* sum);

/// Rows [row_begin, row_end) of a kRows16 product, whole groups of 16 (row_begin a multiple of 16),
/// for every token with AVX2: y[t * out_features + o] (plus bias[o]), `format` Q8_0, Q4_0 or Q4_1. A
/// token's outputs are the same whatever the number of tokens.
void product_avx2(QuantFormat format, const uint8_t* w, int64_t row_bytes, const RowTokens& x, int64_t tokens, int64_t row_begin,
                  int64_t row_end, float* y, int64_t out_features, const float* bias);

}  // namespace torchpatch::nn::rows16
