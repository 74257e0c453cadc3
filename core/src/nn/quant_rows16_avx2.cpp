// kRows16 weights (nn/quant.h) multiplied with AVX2: decoding and prefill, every 32-weight format.
//
// A kRows16 register k of a block holds, in 32-bit lane i, bytes 4k..4k+3 of row i's quants; its two
// 256-bit halves are rows 0-7 and 8-15 of the group. So with AVX2 as with AVX-512 each lane is one
// row: a multiply of those 4 bytes by 4 activation bytes broadcast advances 8 rows at once, the sums
// come out one row a lane, and scaling is one multiply-add by the 8 rows' scales per block (the GGUF
// row kernel in quant_kernels.cpp spends a multiply-add per row and block, and a horizontal sum per
// row). AVX2 has no dpbusd: maddubs multiplies unsigned by signed bytes into int16 pairs, saturating.
//   Q4_0  nibbles 0..15 times |x| <= 127: a pair is at most 3810, so all 8 multiplies of a block add
//         up in int16 (30480) before one madd widens them; the offset 8 enters as -8 sum(x_q).
//   Q4_1  the same nibbles; its stored offset m enters per block as m d_x sum(x_q), one multiply-add
//         by the 8 rows' m.
//   Q5_0, Q5_1  the nibbles with each weight's fifth bit (16) or'ed in, spread from the rows' 32-bit
//         words of fifth bits by a byte shuffle and a compare; values up to 31, so the int16 sums are
//         widened twice a block. Offset 16 (Q5_0) or m (Q5_1) as above.
//   Q8_0  w + 128 would saturate; the signed weight's magnitude times x carrying its sign (the sign
//         trick) is w x exactly, widened every multiply. The weights are kept signed for this: an
//         XOR per load cost decoding 5-10 %.
// Prefill takes 4 tokens at a time over a group's rows, which stay in L1 while the tokens of a chunk
// pass; every token goes through the same operations in the same order, so a token's outputs do not
// depend on how many tokens share the product.
#include "nn/quant_rows16.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/x86_intrinsics.h"
#include "nn/quant_block.h"

namespace torchpatch::nn::rows16 {

namespace {

#define TP_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TP_UNROLL _Pragma("GCC unroll 16")
// The block's helpers must inline: their sums and accumulators are arrays that have to stay in registers.
#define TP_INLINE inline __attribute__((always_inline))

constexpr int64_t kBlock = kQuantBlockSize;
constexpr int kTokens = 4;  // prefill's tokens per pass over a group

TP_AVX2 inline __m256i broadcast_word(const int8_t* p) {
  int32_t word = 0;
  std::memcpy(&word, p, 4);
  return _mm256_set1_epi32(word);
}

// x * id rounded as quantize_activations does, as int32.
TP_AVX2 inline __m256i round_to_int8_range(__m256 x, __m256 id) {
  __m256 v = _mm256_round_ps(_mm256_mul_ps(x, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));  // NaN -> 0
  v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
  return _mm256_cvtps_epi32(v);
}

TP_AVX2 inline int32_t sum_lanes(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

TP_AVX2 inline float max_lanes(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/// Bytes 0x10 where the fifth bit of weight 4 n + j (j = 0..3 the byte of a lane) is set in `qh`
/// (8 rows' 32 fifth bits, one row a lane): byte n / 2 of each lane spread over the lane's 4 bytes,
/// then one bit of nibble n % 2 tested per byte.
TP_AVX2 TP_INLINE __m256i fifth_bits(__m256i qh, int n) {
  const char s = static_cast<char>(n / 2);
  const __m256i spread = _mm256_shuffle_epi8(
      qh, _mm256_setr_epi8(s, s, s, s, 4 + s, 4 + s, 4 + s, 4 + s, 8 + s, 8 + s, 8 + s, 8 + s, 12 + s, 12 + s, 12 + s,
                           12 + s, s, s, s, s, 4 + s, 4 + s, 4 + s, 4 + s, 8 + s, 8 + s, 8 + s, 8 + s, 12 + s, 12 + s,
                           12 + s, 12 + s));
  const __m256i bit = _mm256_set1_epi32(n % 2 ? static_cast<int>(0x80402010) : 0x08040201);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

/// Q8_0's int32 sums of one block for H halves x TT tokens: the signed weights' magnitudes times the
/// activations carrying the weights' signs (the sign trick), widened every multiply.
template <int TT, int H>
TP_AVX2 TP_INLINE void q8_sums(const uint8_t* quants, const int8_t* const* xq, __m256i (*sums)[TT]) {
  const __m256i ones = _mm256_set1_epi16(1);
  TP_UNROLL for (int k = 0; k < 8; ++k) {
    __m256i xk[TT];
    TP_UNROLL for (int t = 0; t < TT; ++t) xk[t] = broadcast_word(xq[t] + 4 * k);
    TP_UNROLL for (int h = 0; h < H; ++h) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + 64 * k + 32 * h));
      const __m256i magnitude = _mm256_sign_epi8(w, w);  // -128 stays 0x80: 128 unsigned
      TP_UNROLL for (int t = 0; t < TT; ++t) {
        const __m256i products = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xk[t], w));
        sums[h][t] = _mm256_add_epi32(sums[h][t], _mm256_madd_epi16(products, ones));
      }
    }
  }
}

/// The nibble formats' int32 sums of one block (Q5's fifth bits or'ed in from qh[h]): 16 products of
/// nibbles fit an int16 (30480), only 8 of 5-bit values, so Q5 widens after every two registers.
template <bool Q5, int TT, int H>
TP_AVX2 TP_INLINE void nibble_sums(const uint8_t* quants, const __m256i* qh, const int8_t* const* xq, __m256i (*sums)[TT]) {
  constexpr int kWiden = Q5 ? 2 : 4;
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0f);
  TP_UNROLL for (int k0 = 0; k0 < 4; k0 += kWiden) {
    __m256i pairs[H][TT];
    TP_UNROLL for (int h = 0; h < H; ++h) {
      TP_UNROLL for (int t = 0; t < TT; ++t) pairs[h][t] = _mm256_setzero_si256();
    }
    TP_UNROLL for (int k = k0; k < k0 + kWiden; ++k) {
      __m256i x_lo[TT], x_hi[TT];
      TP_UNROLL for (int t = 0; t < TT; ++t) {
        x_lo[t] = broadcast_word(xq[t] + 4 * k);
        x_hi[t] = broadcast_word(xq[t] + 16 + 4 * k);
      }
      TP_UNROLL for (int h = 0; h < H; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + 64 * k + 32 * h));
        __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        if constexpr (Q5) {
          lo = _mm256_or_si256(lo, fifth_bits(qh[h], k));
          hi = _mm256_or_si256(hi, fifth_bits(qh[h], 4 + k));
        }
        TP_UNROLL for (int t = 0; t < TT; ++t) {
          pairs[h][t] = _mm256_add_epi16(pairs[h][t], _mm256_maddubs_epi16(lo, x_lo[t]));
          pairs[h][t] = _mm256_add_epi16(pairs[h][t], _mm256_maddubs_epi16(hi, x_hi[t]));
        }
      }
    }
    TP_UNROLL for (int h = 0; h < H; ++h) {
      TP_UNROLL for (int t = 0; t < TT; ++t) sums[h][t] = _mm256_add_epi32(sums[h][t], _mm256_madd_epi16(pairs[h][t], ones));
    }
  }
}

/// Block b of halves h0 .. h0 + H - 1 of a group (header: the block's; half h's 8 d at header + 16 h,
/// Q4_1's and Q5_1's m 32 bytes further, Q5's fifth bits at header + 16 fifth + 32 h; its register k
/// at quants + 64 k + 32 (h - h0)) times tokens [0, TT), added to acc[h - h0][t]. Each activation
/// word is broadcast once for the H halves.
template <QuantFormat F, int TT, int H>
TP_AVX2 TP_INLINE void block_halves(const uint8_t* header, int h0, const uint8_t* quants, int64_t b, const RowTokens& x,
                                 __m256 (*acc)[TT]) {
  constexpr block::Layout32 kLayout = block::layout32(F);
  const int8_t* xq[TT];
  TP_UNROLL for (int t = 0; t < TT; ++t) xq[t] = x.q + (t * x.blocks + b) * kBlock;
  __m256i sums[H][TT];
  TP_UNROLL for (int h = 0; h < H; ++h) {
    TP_UNROLL for (int t = 0; t < TT; ++t) sums[h][t] = _mm256_setzero_si256();
  }
  if constexpr (F == QuantFormat::kQ8_0) {
    q8_sums<TT, H>(quants, xq, sums);
  } else if constexpr (kLayout.fifth >= 0) {
    __m256i qh[H];
    TP_UNROLL for (int h = 0; h < H; ++h) {
      qh[h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(header + 16 * kLayout.fifth + 32 * (h0 + h)));
    }
    nibble_sums<true, TT, H>(quants, qh, xq, sums);
  } else {
    nibble_sums<false, TT, H>(quants, nullptr, xq, sums);
  }
  TP_UNROLL for (int h = 0; h < H; ++h) {
    const uint8_t* d = header + 16 * (h0 + h);
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d)));
    TP_UNROLL for (int t = 0; t < TT; ++t) {
      const int64_t at = t * x.blocks + b;
      const __m256i total = _mm256_add_epi32(sums[h][t], _mm256_set1_epi32(x.init[at]));
      acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(dw, _mm256_set1_ps(x.d[at])), acc[h][t]);
    }
    if constexpr (kLayout.stored_b) {
      const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + 32)));
      TP_UNROLL for (int t = 0; t < TT; ++t) acc[h][t] = _mm256_fmadd_ps(m, _mm256_set1_ps(x.x_sum[t * x.blocks + b]), acc[h][t]);
    }
  }
}

/// Rows 8 h0 .. 8 (h0 + H) - 1 of one group x tokens [0, TT): out[t * out_stride + i] for row i of
/// the group. H = 2 consumes each 64 bytes of the stream at once (decoding, where memory sets the
/// pace); H = 1 keeps more tokens' sums in the 16 registers (prefill, the group in L1).
template <QuantFormat F, int TT, int H>
TP_AVX2 void group_pass(const uint8_t* group, int h0, const RowTokens& x, float* out, int64_t out_stride,
                        const float* bias) {
  constexpr int64_t bytes = block::layout32(F).bytes, header = block::header_bytes(F);
  __m256 acc[H][TT];
  TP_UNROLL for (int h = 0; h < H; ++h) {
    TP_UNROLL for (int t = 0; t < TT; ++t) acc[h][t] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < x.blocks; ++b) {
    const block::Rows16Block at = block::rows16_block(b, x.blocks, bytes, header);
    block_halves<F, TT, H>(group + at.scales, h0, group + at.quants + 32 * h0, b, x, acc);
  }
  TP_UNROLL for (int h = 0; h < H; ++h) {
    const int64_t row = 8 * (h0 + h);
    const __m256 bv = bias ? _mm256_loadu_ps(bias + row) : _mm256_setzero_ps();
    TP_UNROLL for (int t = 0; t < TT; ++t) _mm256_storeu_ps(out + t * out_stride + row, _mm256_add_ps(acc[h][t], bv));
  }
}

template <QuantFormat F, int TT>
TP_AVX2 void group_tokens(const uint8_t* group, const RowTokens& x, float* out, int64_t out_stride, const float* bias) {
  if constexpr (TT <= 2) {
    group_pass<F, TT, 2>(group, 0, x, out, out_stride, bias);
  } else {
    group_pass<F, TT, 1>(group, 0, x, out, out_stride, bias);
    group_pass<F, TT, 1>(group, 1, x, out, out_stride, bias);
  }
}

template <QuantFormat F>
void product(const uint8_t* w, int64_t row_bytes, const RowTokens& x, int64_t tokens, int64_t row_begin,
             int64_t row_end, float* y, int64_t out_features, const float* bias) {
  for_groups_and_tokens(w, row_bytes, x, tokens, row_begin, row_end, y, out_features, bias, kTokens, 256 * 1024,
                        [&](const uint8_t* group, const RowTokens& xt, float* out, const float* b, int64_t n) {
                          switch (n) {
                            case 4: group_tokens<F, 4>(group, xt, out, out_features, b); break;
                            case 3: group_tokens<F, 3>(group, xt, out, out_features, b); break;
                            case 2: group_tokens<F, 2>(group, xt, out, out_features, b); break;
                            default: group_tokens<F, 1>(group, xt, out, out_features, b); break;
                          }
                        });
}

}  // namespace

TP_AVX2 void quantize_activations_avx2(const float* x, int64_t k, int8_t* q, float* d, int32_t* sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    __m256 v[4];
    // max(a, b) returns b when a is NaN: NaNs are skipped, as std::max(amax, NaN) does.
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      m = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), m);
    }
    const float amax = max_lanes(m);
    d[b] = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    __m256i r[4];
    for (int i = 0; i < 4; ++i) r[i] = round_to_int8_range(v[i], id);
    sum[b] = sum_lanes(_mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3])));
    // Packing works within 128-bit lanes: the 32 bytes come out as dwords 0 4 1 5 2 6 3 7.
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kBlock),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
}

void product_avx2(QuantFormat format, const uint8_t* w, int64_t row_bytes, const RowTokens& x, int64_t tokens,
                  int64_t row_begin, int64_t row_end, float* y, int64_t out_features, const float* bias) {
  switch (format) {
    case QuantFormat::kQ8_0: product<QuantFormat::kQ8_0>(w, row_bytes, x, tokens, row_begin, row_end, y, out_features, bias); break;
    case QuantFormat::kQ4_0: product<QuantFormat::kQ4_0>(w, row_bytes, x, tokens, row_begin, row_end, y, out_features, bias); break;
    case QuantFormat::kQ4_1: product<QuantFormat::kQ4_1>(w, row_bytes, x, tokens, row_begin, row_end, y, out_features, bias); break;
    case QuantFormat::kQ5_0: product<QuantFormat::kQ5_0>(w, row_bytes, x, tokens, row_begin, row_end, y, out_features, bias); break;
    case QuantFormat::kQ5_1: product<QuantFormat::kQ5_1>(w, row_bytes, x, tokens, row_begin, row_end, y, out_features, bias); break;
    default: break;  // no kRows16 layout
  }
}

}  // namespace torchpatch::nn::rows16
