// Products with Q8_0 / Q4_0 weights (nn/quant.h), and with Q4_1 / Q5_0 / Q5_1 when decoding (fewer
// than kTileTokens tokens; prompts take quant_ggml_kernels.cpp's float path): y = x W^T + b, x float
// [T, in], W blocks [out, in/32]. As llama.cpp does, each row of x is first quantized to Q8_0 (an int8
// block and a float32 scale per 32 values), so a block's dot product is 32 int8 products summed
// exactly in int32, then scaled by d_w * d_x. Weights enter unsigned (Q4_0: 0..15) and their offset
// comes back per block as 8 * sum(x_q) (16 for Q5_0, 128 for Q8_0); Q4_1's and Q5_1's stored offset m
// as m d_x sum(x_q) in float.
//
// Kernels, chosen at run time:
//   scalar   plain C++, one dot per (row, token)
//   AVX2     kRows16 groups: quant_rows16_avx2.cpp. GGUF rows: maddubs / madd over 32 bytes, the
//            sign trick for Q8_0's signed weights, tiles of 4 rows x 2 tokens
//   AVX-512  VNNI's dpbusd (unsigned x signed bytes into int32). The weights enter unsigned: Q8_0 as
//            w + 128 (an XOR as they load; exact for every int8), Q4_0 as its nibbles 0..15; each block's int32 sum starts
//            at minus that offset (128 or 8) times the block's sum of activations, so it comes out
//            exactly sum(w * x). Two layouts:
//     kRows16  (nn/quant.h, what models hold on these CPUs) 16 rows at a time, lane i of each register
//              one row's 4 bytes, so a dpbusd with 4 activation bytes broadcast advances all 16 rows
//              and the sums need no shuffles. Decoding takes the tokens (fewer than 4) in one pass;
//              prefill 8 at a time while the group's blocks stay in cache, with the same arithmetic
//              per token, so a token's outputs do not depend on how many tokens share the product.
//              Q4_1, Q5_0 and Q5_1 (decoding only) the same way, Q5's fifth bits added to the nibbles
//              under a mask, a stored offset m by one multiply-add per block.
//     GGUF rows  decode: two blocks per 512-bit register (lanes 0-7 one block, 8-15 the next), one row
//              after another; per pair of blocks one convert and one multiply-add by the two scales;
//              one token's rows summed 16 at a time. Every 32-weight format.
//              prefill (4 tokens or more; also kRows16's tail rows): groups of 16 blocks, lane i of
//              register k holding bytes 4k..4k+3 of block i: 8 dpbusd finish 16 blocks, one convert
//              and one multiply-add per 16 blocks. Tiles of 4 rows x 4 tokens; a tile's rows are
//              rearranged once (gathers) and used for every token of a chunk whose activations stay in L2.
// Output rows are split across LibTorch's intra-op threads; each output is computed by one thread in
// one order (the same whatever tile or task it falls in), so a result does not depend on the thread count.
#include "torchpatch/nn/quant.h"

#include <cpuid.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <type_traits>
#include <cstring>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/error.h"
#include "base/cpu_level.h"
#include "base/parallel.h"
#include "base/x86_intrinsics.h"
#include "nn/quant_block.h"
#include "nn/quant_device.h"
#include "nn/quant_ggml.h"
#include "nn/quant_rows16.h"
#include "nn/quant_unpack32.h"

namespace torchpatch::nn {

namespace {

constexpr int64_t kBlock = kQuantBlockSize;

/// One row of activations in Q8_0: `q` [k], per block its scale `d` and the sum of its values.
struct QuantizedRow {
  const int8_t* q;
  const float* d;
  const int32_t* sum;
};

using block::kQ4_0Bytes;
using block::kQ8_0Bytes;
using block::kScaleBytes;
using block::load_half;

// Activations: d = amax / 127, q = round-to-nearest-even(x / d). Not the weights' reference rounding
// (half away from zero): what matters here is that the scalar and vector kernels agree.
void quantize_activations(const float* x, int64_t k, int8_t* q, float* d, int32_t* sum) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float amax = 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
    d[b] = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t s = 0;
    for (int64_t j = 0; j < kBlock; ++j) {
      const float v = std::nearbyint(xb[j] * id);
      q[b * kBlock + j] = static_cast<int8_t>(std::isnan(v) ? 0.0f : std::clamp(v, -127.0f, 127.0f));
      s += q[b * kBlock + j];
    }
    sum[b] = s;
  }
}

// -- scalar ---------------------------------------------------------------------------------------------
//
// Every 32-weight format as w = d q + b with q unsigned (nn/quant_block.h): a block's product is
// d dx (q . x_q) + b dx sum(x_q), the first summed exactly in int32; where b is -offset * d (Q8_0,
// Q4_0, Q5_0) the offset enters the int32 sum too, where b is stored (Q4_1, Q5_1) it is added in float.

template <QuantFormat F>
float dot32_scalar(const uint8_t* w, const QuantizedRow& x, int64_t blocks) {
  constexpr block::Layout32 L = block::layout32(F);
  float total = 0.0f;
  uint8_t q[kBlock];
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* wb = w + b * L.bytes;
    block::unpack32<F>(wb, q);
    const int8_t* xq = x.q + b * kBlock;
    int32_t acc = -L.offset * x.sum[b];
    for (int64_t j = 0; j < kBlock; ++j) acc += q[j] * xq[j];
    total += load_half(wb) * x.d[b] * static_cast<float>(acc);
    if constexpr (L.stored_b) total += load_half(wb + kScaleBytes) * (x.d[b] * static_cast<float>(x.sum[b]));
  }
  return total;
}

// -- AVX2 -----------------------------------------------------------------------------------------------

__attribute__((target("avx2,fma,f16c"))) inline float hsum_avx2(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

__attribute__((target("avx2,fma,f16c"))) inline float half_avx2(const uint8_t* p) {
  return _cvtsh_ss(static_cast<uint16_t>(p[0] | p[1] << 8));
}

// 8 int32 partial sums of 32 products of unsigned `u` and signed `s` bytes.
__attribute__((target("avx2,fma,f16c"))) inline __m256i dot_us8_avx2(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// Rows [0, RT) (each `row_bytes` from the last) x tokens x[0, TT) of the AVX2 product, into
// out[t * out_stride + r] (plus bias[r]): each weight block is loaded, unpacked and scaled once for TT
// tokens, each activation block once for RT rows, and every (row, token) takes the same operations in
// the same order whatever RT and TT, so a token's outputs do not depend on the tile it falls in
// (decoding's 1 x 1 tile included).
template <QuantFormat F, int RT, int TT>
__attribute__((target("avx2,fma,f16c"))) void tile32_avx2(const uint8_t* w, int64_t row_bytes, const QuantizedRow* x,
                                                          int64_t blocks, float* out, int64_t out_stride,
                                                          const float* bias) {
  constexpr block::Layout32 L = block::layout32(F);
  __m256 acc[RT][TT];
  float stored[RT][TT] = {};
  for (int r = 0; r < RT; ++r) {
    for (int t = 0; t < TT; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i qx[TT];
    for (int t = 0; t < TT; ++t) qx[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t].q + b * kBlock));
    for (int r = 0; r < RT; ++r) {
      const uint8_t* wb = w + r * row_bytes + b * L.bytes;
      const float dw = half_avx2(wb);
      __m256i qw, unsigned_w;
      if constexpr (F == QuantFormat::kQ8_0) {
        // maddubs multiplies unsigned by signed bytes and would saturate pairs of w + 128: |w| times x
        // carrying w's sign is w * x, with no offset.
        qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + kScaleBytes));
        unsigned_w = _mm256_sign_epi8(qw, qw);
      } else {
        unsigned_w = block::quants32_avx2<F>(wb);
      }
      for (int t = 0; t < TT; ++t) {
        __m256i products;
        if constexpr (F == QuantFormat::kQ8_0) {
          products = dot_us8_avx2(unsigned_w, _mm256_sign_epi8(qx[t], qw));
        } else {
          // 8 lanes of -(offset / 8) sum(x_q) add up to the offset's part (offsets are multiples of 8).
          products = _mm256_add_epi32(dot_us8_avx2(unsigned_w, qx[t]), _mm256_set1_epi32(-(L.offset / 8) * x[t].sum[b]));
        }
        acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * x[t].d[b]), _mm256_cvtepi32_ps(products), acc[r][t]);
        if constexpr (L.stored_b) {
          stored[r][t] += half_avx2(wb + kScaleBytes) * (x[t].d[b] * static_cast<float>(x[t].sum[b]));
        }
      }
    }
  }
  for (int r = 0; r < RT; ++r) {
    for (int t = 0; t < TT; ++t) out[t * out_stride + r] = hsum_avx2(acc[r][t]) + stored[r][t] + (bias ? bias[r] : 0.0f);
  }
}

// Rows [begin, end) x every token with AVX2, in tiles of 4 rows x 2 tokens (a token's rows stay in L1,
// the tokens' activations in L2).
template <QuantFormat F>
__attribute__((target("avx2,fma,f16c"))) void tiles32_avx2(const uint8_t* w, int64_t row_bytes,
                                                           const std::vector<QuantizedRow>& x, int64_t blocks,
                                                           int64_t begin, int64_t end, float* y, int64_t out_features,
                                                           const float* bias) {
  const auto tokens = static_cast<int64_t>(x.size());
  for (int64_t o = begin; o < end; o += 4) {
    const uint8_t* rows = w + o * row_bytes;
    const float* b = bias ? bias + o : nullptr;
    const auto tile = [&](auto rt) {
      constexpr int RT = decltype(rt)::value;
      int64_t t = 0;
      for (; t + 2 <= tokens; t += 2) tile32_avx2<F, RT, 2>(rows, row_bytes, &x[t], blocks, y + t * out_features + o, out_features, b);
      if (t < tokens) tile32_avx2<F, RT, 1>(rows, row_bytes, &x[t], blocks, y + t * out_features + o, out_features, b);
    };
    switch (std::min<int64_t>(4, end - o)) {
      case 4: tile(std::integral_constant<int, 4>()); break;
      case 3: tile(std::integral_constant<int, 3>()); break;
      case 2: tile(std::integral_constant<int, 2>()); break;
      default: tile(std::integral_constant<int, 1>()); break;
    }
  }
}

using TilesFn = void (*)(const uint8_t*, int64_t, const std::vector<QuantizedRow>&, int64_t, int64_t, int64_t, float*,
                         int64_t, const float*);

TilesFn tiles_avx2_for(QuantFormat format) {
  switch (format) {
    case QuantFormat::kQ8_0: return tiles32_avx2<QuantFormat::kQ8_0>;
    case QuantFormat::kQ4_0: return tiles32_avx2<QuantFormat::kQ4_0>;
    case QuantFormat::kQ4_1: return tiles32_avx2<QuantFormat::kQ4_1>;
    case QuantFormat::kQ5_0: return tiles32_avx2<QuantFormat::kQ5_0>;
    case QuantFormat::kQ5_1: return tiles32_avx2<QuantFormat::kQ5_1>;
    default: return nullptr;
  }
}

// -- AVX-512 VNNI ---------------------------------------------------------------------------------------

#define TP_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
// Loops over a tile's rows and tokens, unrolled so that accumulators and weights stay in registers.
#define TP_UNROLL _Pragma("GCC unroll 16")

constexpr int kTileRows = 4;
constexpr int kTileTokens = 4;  // from this many tokens on, the prefill layout (groups of 16 blocks)

// x * id rounded as quantize_activations does (nearest even, NaN -> 0, clamped to +-127), as int32.
TP_AVX512 inline __m512i round_to_int8_range(__m512 x, __m512 id) {
  __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(x, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
  v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
  return _mm512_cvtps_epi32(v);
}

// quantize_activations with AVX-512: the same q, d and sums, bit for bit.
TP_AVX512 void quantize_activations_avx512(const float* x, int64_t k, int8_t* q, float* d, int32_t* sum) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    const __m512 lo = _mm512_loadu_ps(xb), hi = _mm512_loadu_ps(xb + 16);
    // max(a, b) returns b when a is NaN: NaNs are skipped, as std::max(amax, NaN) does.
    __m512 m = _mm512_max_ps(_mm512_abs_ps(lo), _mm512_setzero_ps());
    m = _mm512_max_ps(_mm512_abs_ps(hi), m);
    const float amax = _mm512_reduce_max_ps(m);
    d[b] = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    const __m512i qlo = round_to_int8_range(lo, id), qhi = round_to_int8_range(hi, id);
    sum[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kBlock), _mm512_cvtepi32_epi8(qlo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kBlock + 16), _mm512_cvtepi32_epi8(qhi));
  }
}

// ---- decoding (fewer than kTileTokens tokens): pairs of blocks, weights read once, straight from memory
//
// Every 32-weight format (GGUF rows): Q8_0 and Q4_0 here and from kRows16's tail rows; Q4_1, Q5_0 and
// Q5_1, which only GGUF files hold, here alone.

constexpr int64_t kPairBytes = 2 * kBlock;
// Software prefetch, bytes ahead of the pair being read, measured: it helps the 4- and 5-bit formats
// (whose rows go by faster than the hardware prefetcher ramps up), and slows Q8_0 down, which streams
// as well without.
template <QuantFormat F>
constexpr std::uintptr_t kPrefetchDistance = F == QuantFormat::kQ8_0 ? 0 : 1024;

/// Activations per token and pair of blocks (an odd last block paired with zeros): 64 bytes of q, the
/// two blocks' scales each over 8 lanes, minus the weights' offset (Q8_0: 128, Q4_0: 8, Q5_0: 16)
/// times each block's sum of q spread over its 8 lanes, and for the formats that store b (Q4_1,
/// Q5_1) each block's d sum(q) over its 8 lanes.
struct PairedTokens {
  int64_t pairs;
  const int8_t* q;
  const float* d;
  const int32_t* init;
  const float* sums;
};

TP_AVX512 void pair_token_avx512(const block::Layout32& layout, const int8_t* q, const float* d, const int32_t* sum,
                                 int64_t blocks, int8_t* xq, float* dx, int32_t* init, float* sums) {
  const int64_t pairs = (blocks + 1) / 2;
  for (int64_t b = 0; b < pairs * 2; ++b) {
    const bool real = b < blocks;
    const __m256i v =
        real ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + b * kBlock)) : _mm256_setzero_si256();
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + b * kBlock), v);
    _mm256_storeu_ps(dx + b * 8, _mm256_set1_ps(real ? d[b] : 0.0f));
    // 8 lanes of -(offset / 8) * sum add up to -offset * sum (every offset is a multiple of 8), and 8 of
    // d sum / 8 to d sum (exact: a power of two).
    const int32_t lane = real ? -(layout.offset / 8) * sum[b] : 0;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(init + b * 8), _mm256_set1_epi32(lane));
    if (layout.stored_b) _mm256_storeu_ps(sums + b * 8, _mm256_set1_ps(real ? d[b] * static_cast<float>(sum[b]) / 8 : 0.0f));
  }
}

/// One row's pair of blocks in registers: the weights as unsigned bytes (in the activations' order)
/// and, over 8 lanes each, the two scales d and (Q4_1, Q5_1) the two stored b.
struct WeightPair {
  __m512i w;
  __m512 d;
  __m512 b;
};

// Word indices (vpermw) into the bytes of a pair of blocks of the 4- and 5-bit formats: `scales` the
// two d (lanes 0-15) then the two stored b (16-31), `quants` each block's 16 bytes of nibbles repeated
// over two 128-bit lanes (the second shifted by kNibbleShifts to its high nibbles).
struct alignas(64) PairWords {
  uint16_t scales[32];
  uint16_t quants[32];
};

constexpr PairWords pair_words(QuantFormat format) {
  const block::Layout32 layout = block::layout32(format);
  const auto block_words = static_cast<uint16_t>(layout.bytes / 2);
  PairWords words{};
  for (int i = 0; i < 32; ++i) {
    const int second = (i % 16) / 8;  // lanes 8-15 (and 24-31) the second block
    words.scales[i] = static_cast<uint16_t>(second * block_words + (i < 16 ? 0 : 1));
    words.quants[i] = static_cast<uint16_t>((i / 16) * block_words + layout.quants / 2 + i % 8);
  }
  return words;
}

template <QuantFormat F>
constexpr PairWords kPairWords = pair_words(F);

// Scales of Q8_0's pair, whose second block starts at byte 34 (word 17).
alignas(64) constexpr uint16_t kQ8Scales[32] = {0,  0,  0,  0,  0,  0,  0,  0,  17, 17, 17, 17, 17, 17, 17, 17,
                                                0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0};
// Per 16-bit word: shift the second and fourth 128-bit lanes by 4 (the high nibbles).
alignas(64) constexpr uint16_t kNibbleShifts[32] = {0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4,
                                                    0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4};

template <QuantFormat F>
TP_AVX512 inline WeightPair load_weight_pair(const uint8_t* row, int64_t pair, bool both) {
  constexpr block::Layout32 L = block::layout32(F);
  const uint8_t* b0 = row + pair * 2 * L.bytes;
  WeightPair p;
  if constexpr (F == QuantFormat::kQ8_0) {
    // The pair's first 64 bytes hold both scales (an odd last block alone: its 34 bytes, no more read).
    const __m512i head = both ? _mm512_loadu_si512(b0) : _mm512_maskz_loadu_epi8((1ull << kQ8_0Bytes) - 1, b0);
    p.d = _mm512_cvtph_ps(_mm512_castsi512_si256(
        _mm512_permutexvar_epi16(_mm512_load_si512(kQ8Scales), head)));
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + kScaleBytes));
    const __m256i hi = both ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + L.bytes + kScaleBytes))
                            : _mm256_setzero_si256();
    // w + 128 as unsigned (exact for every int8, -128 too); the activations' sums take the 128 back.
    p.w = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8(-128));
  } else {
    // A pair is 36 to 48 bytes: one load (an odd last block alone: its own bytes, no more read).
    const __m512i all = _mm512_maskz_loadu_epi8(both ? (1ull << (2 * L.bytes)) - 1 : (1ull << L.bytes) - 1, b0);
    const __m512i scales = _mm512_permutexvar_epi16(_mm512_load_si512(kPairWords<F>.scales), all);
    p.d = _mm512_cvtph_ps(_mm512_castsi512_si256(scales));
    if constexpr (L.stored_b) p.b = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(scales, 1));
    const __m512i halves = _mm512_permutexvar_epi16(_mm512_load_si512(kPairWords<F>.quants), all);
    p.w = _mm512_and_si512(_mm512_srlv_epi16(halves, _mm512_load_si512(kNibbleShifts)), _mm512_set1_epi8(0x0f));
    if constexpr (L.fifth >= 0) {  // bit j of the pair's 64 fifth bits is weight j's
      const uint64_t fifth = block::load_word(b0 + L.fifth) |
                             (both ? static_cast<uint64_t>(block::load_word(b0 + L.bytes + L.fifth)) << 32 : 0);
      p.w = _mm512_mask_add_epi8(p.w, _cvtu64_mask64(fifth), p.w, _mm512_set1_epi8(16));
    }
  }
  return p;
}

/// Pair p of one row times tokens [0, TT), added to acc[t].
template <QuantFormat F, int TT>
TP_AVX512 inline void decode_pair_avx512(const uint8_t* row, int64_t p, int64_t blocks, const PairedTokens& x,
                                         __m512* acc) {
  constexpr block::Layout32 L = block::layout32(F);
  if (kPrefetchDistance<F> != 0) {
    // (The address as an integer: past the weight's end it is no pointer; prefetching never faults.)
    _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(row + p * 2 * L.bytes) +
                                               kPrefetchDistance<F>),
                 _MM_HINT_T0);
  }
  const WeightPair w = load_weight_pair<F>(row, p, 2 * p + 1 < blocks);
  TP_UNROLL for (int t = 0; t < TT; ++t) {
    const int64_t at = t * x.pairs + p;
    const __m512i dot = _mm512_dpbusd_epi32(_mm512_loadu_si512(x.init + at * 16), w.w,
                                            _mm512_loadu_si512(x.q + at * kPairBytes));
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(w.d, _mm512_loadu_ps(x.d + at * 16)), acc[t]);
    if constexpr (L.stored_b) acc[t] = _mm512_fmadd_ps(w.b, _mm512_loadu_ps(x.sums + at * 16), acc[t]);
  }
}

/// One row x tokens [0, TT): sums[t] = the row's dot with token t, over 16 lanes. Two accumulators per
/// token (even and odd pairs) keep two multiply-adds in flight.
template <QuantFormat F, int TT>
TP_AVX512 inline void decode_row_avx512(const uint8_t* row, int64_t blocks, const PairedTokens& x, __m512* sums) {
  const int64_t pairs = x.pairs;
  __m512 even[TT], odd[TT];
  TP_UNROLL for (int t = 0; t < TT; ++t) even[t] = odd[t] = _mm512_setzero_ps();
  int64_t p = 0;
  for (; p + 2 <= pairs; p += 2) {
    decode_pair_avx512<F, TT>(row, p, blocks, x, even);
    decode_pair_avx512<F, TT>(row, p + 1, blocks, x, odd);
  }
  if (p < pairs) decode_pair_avx512<F, TT>(row, p, blocks, x, even);
  TP_UNROLL for (int t = 0; t < TT; ++t) sums[t] = _mm512_add_ps(even[t], odd[t]);
}

/// Lane i of the result is the sum of the lanes of v[(i % 4) * 4 + i / 4] (a transposing tree of adds:
/// about two instructions a vector, against eight for each vector's own sum). Overwrites v.
TP_AVX512 inline __m512 sum_lanes16(__m512* v) {
  for (int i = 0; i < 8; ++i) {
    v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xDD));
  }
  for (int i = 0; i < 2; ++i) {
    v[i] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0xEE));
  }
  return _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xDD));
}

/// Output rows [row_begin, row_end) for tokens < kTileTokens, one row after another (one stream
/// from memory: faster here than several rows at once); y[t * out_features + o]. One token's rows
/// are summed 16 at a time (rows of a few blocks spent a fifth of their time on their own sums).
template <QuantFormat F>
TP_AVX512 void decode_rows_avx512(const uint8_t* w, int64_t row_bytes, int64_t blocks, const PairedTokens& x,
                                  int64_t tokens, int64_t row_begin, int64_t row_end, float* y, int64_t out_features,
                                  const float* bias) {
  if (tokens == 1) {
    for (int64_t o = row_begin; o < row_end; o += 16) {
      const int n = static_cast<int>(std::min<int64_t>(16, row_end - o));
      __m512 sums[16];
      for (int r = 0; r < 16; ++r) {
        __m512& slot = sums[(r % 4) * 4 + r / 4];
        if (r < n) {
          decode_row_avx512<F, 1>(w + (o + r) * row_bytes, blocks, x, &slot);
        } else {
          slot = _mm512_setzero_ps();
        }
      }
      const __mmask16 rows = static_cast<__mmask16>((1u << n) - 1);
      const __m512 b = bias ? _mm512_maskz_loadu_ps(rows, bias + o) : _mm512_setzero_ps();
      _mm512_mask_storeu_ps(y + o, rows, _mm512_add_ps(sum_lanes16(sums), b));
    }
    return;
  }
  for (int64_t o = row_begin; o < row_end; ++o) {
    const float b = bias ? bias[o] : 0.0f;
    __m512 sums[3];
    switch (tokens) {
      case 3: decode_row_avx512<F, 3>(w + o * row_bytes, blocks, x, sums); break;
      default: decode_row_avx512<F, 2>(w + o * row_bytes, blocks, x, sums); break;
    }
    for (int64_t t = 0; t < tokens; ++t) y[t * out_features + o] = _mm512_reduce_add_ps(sums[t]) + b;
  }
}

// ---- decoding kRows16 weights (nn/quant.h): 16 rows at a time, one stream from memory
//
// Register k of a block holds, in lane i, bytes 4k..4k+3 of row i's quants: a dpbusd with those 4
// activation bytes broadcast adds 4 products to each of the 16 rows, and the 16 sums come out in the
// lanes of one register (no horizontal sums). About 1.5 instructions per 32 weights per row, against
// 8 in the GGUF pair kernel above: fast enough that memory, not instructions, sets the pace.

using rows16::RowTokens;  // init: minus the weights' offset (Q8_0: 128, Q4_0: 8) times each block's sum of q

constexpr std::uintptr_t kRows16Prefetch = 2048;  // bytes ahead; the stream is ~1 KB a pair of blocks

TP_AVX512 inline __m512i broadcast_word(const int8_t* p) {
  int32_t word = 0;
  std::memcpy(&word, p, 4);
  return _mm512_set1_epi32(word);
}

/// Which bytes of `qh` (16 rows' 32 fifth bits, one row a lane) have the fifth bit of weight 4 n + j
/// set, j = 0..3 the byte of a lane: byte n / 2 of each lane spread over its 4 bytes, one bit of
/// nibble n % 2 tested per byte.
TP_AVX512 inline __mmask64 fifth_bits(__m512i qh, int n) {
  const char s = static_cast<char>(n / 2);
  const __m512i spread = _mm512_shuffle_epi8(qh, _mm512_broadcast_i32x4(_mm_setr_epi8(
                                                     s, s, s, s, 4 + s, 4 + s, 4 + s, 4 + s, 8 + s, 8 + s, 8 + s, 8 + s,
                                                     12 + s, 12 + s, 12 + s, 12 + s)));
  return _mm512_test_epi8_mask(spread, _mm512_set1_epi32(n % 2 ? static_cast<int>(0x80402010) : 0x08040201));
}

/// Block b of a group's 16 rows times tokens [0, TT), added to acc[t]. `header` is the block's: the
/// 16 d, Q4_1's and Q5_1's m 32 bytes on, Q5's fifth bits at 16 fifth (nn/quant_block.h).
template <QuantFormat F, int TT>
TP_AVX512 inline void decode_block16(const uint8_t* header, const uint8_t* quants, int64_t b, const RowTokens& x,
                                     __m512* acc) {
  constexpr block::Layout32 kLayout = block::layout32(F);
  constexpr bool Q8 = F == QuantFormat::kQ8_0, Q5 = kLayout.fifth >= 0;
  constexpr int kRegs = Q8 ? 8 : 4;
  const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(header)));
  // Q8_0: the weights + 128 (XOR 0x80); Q4: low nibbles, high nibbles times 16; Q5: both with their fifth bit
  __m512i lo[kRegs], hi[kRegs];
  const __m512i low = _mm512_set1_epi8(0x0f);
  TP_UNROLL for (int k = 0; k < kRegs; ++k) {
    const __m512i v = _mm512_loadu_si512(quants + 64 * k);
    if constexpr (Q8) {
      lo[k] = _mm512_xor_si512(v, _mm512_set1_epi8(-128));
    } else if constexpr (Q5) {
      const __m512i qh = _mm512_loadu_si512(header + 16 * kLayout.fifth), sixteen = _mm512_set1_epi8(16);
      const __m512i l = _mm512_and_si512(v, low), h = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      lo[k] = _mm512_mask_add_epi8(l, fifth_bits(qh, k), l, sixteen);
      hi[k] = _mm512_mask_add_epi8(h, fifth_bits(qh, 4 + k), h, sixteen);
    } else {
      lo[k] = _mm512_and_si512(v, low);
      hi[k] = _mm512_and_si512(v, _mm512_set1_epi8(static_cast<char>(0xf0)));
    }
  }
  TP_UNROLL for (int t = 0; t < TT; ++t) {
    const int64_t at = t * x.blocks + b;
    const int8_t* xq = x.q + at * kBlock;
    __m512i s0 = _mm512_set1_epi32(x.init[at]), s1 = _mm512_setzero_si512();
    if (Q8) {
      TP_UNROLL for (int k = 0; k < kRegs; k += 2) {
        s0 = _mm512_dpbusd_epi32(s0, lo[k], broadcast_word(xq + 4 * k));
        s1 = _mm512_dpbusd_epi32(s1, lo[k + 1], broadcast_word(xq + 4 * k + 4));
      }
    } else {
      TP_UNROLL for (int k = 0; k < kRegs; ++k) {
        s0 = _mm512_dpbusd_epi32(s0, lo[k], broadcast_word(xq + 4 * k));
        s1 = _mm512_dpbusd_epi32(s1, hi[k], broadcast_word(xq + 16 + 4 * k));
      }
      if (!Q5) s1 = _mm512_srai_epi32(s1, 4);  // exact: every product of a high nibble carries a factor 16
    }
    const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(x.d[at]));
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), scale, acc[t]);
  }
  if constexpr (kLayout.stored_b) {
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(header + 32)));
    TP_UNROLL for (int t = 0; t < TT; ++t) acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(x.x_sum[t * x.blocks + b]), acc[t]);
  }
}

/// One group of 16 rows x tokens [0, TT): out[t * out_stride + i] for row i of the group.
template <QuantFormat F, int TT>
TP_AVX512 void decode_group_avx512(const uint8_t* group, const RowTokens& x, float* out, int64_t out_stride,
                                   const float* bias) {
  constexpr int64_t head = block::kGroupRows * block::header_bytes(F);
  constexpr int64_t quant_bytes = block::kGroupRows * (block::layout32(F).bytes - block::header_bytes(F));
  __m512 even[TT], odd[TT];
  TP_UNROLL for (int t = 0; t < TT; ++t) even[t] = odd[t] = _mm512_setzero_ps();
  const uint8_t* p = group;
  int64_t b = 0;
  for (; b + 2 <= x.blocks; b += 2, p += 2 * head + 2 * quant_bytes) {
    _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(p) + kRows16Prefetch), _MM_HINT_T0);
    decode_block16<F, TT>(p, p + 2 * head, b, x, even);
    decode_block16<F, TT>(p + head, p + 2 * head + quant_bytes, b + 1, x, odd);
  }
  if (b < x.blocks) decode_block16<F, TT>(p, p + head, b, x, even);
  const __m512 bv = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  TP_UNROLL for (int t = 0; t < TT; ++t) _mm512_storeu_ps(out + t * out_stride, _mm512_add_ps(_mm512_add_ps(even[t], odd[t]), bv));
}

/// Output rows [row_begin, row_end) (row_begin a multiple of 16 when below `grouped_rows`): the first
/// `grouped_rows` rows are kRows16 groups, decoded 16 at a time; the rows after them (all of them for
/// kBlocks weights, the GGUF tail rows of kRows16) go through the pair kernel.
template <QuantFormat F>
TP_AVX512 void decode_avx512(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t grouped_rows,
                             const RowTokens& x, const PairedTokens& paired, int64_t tokens, int64_t row_begin,
                             int64_t row_end, float* y, const float* bias) {
  const int64_t last = std::min(row_end, grouped_rows);
  int64_t o = row_begin;
  for (; o < last; o += block::kGroupRows) {
    const float* b = bias ? bias + o : nullptr;
    switch (tokens) {
      case 3: decode_group_avx512<F, 3>(w + o * row_bytes, x, y + o, rows, b); break;
      case 2: decode_group_avx512<F, 2>(w + o * row_bytes, x, y + o, rows, b); break;
      default: decode_group_avx512<F, 1>(w + o * row_bytes, x, y + o, rows, b); break;
    }
  }
  if (o < row_end) decode_rows_avx512<F>(w, row_bytes, x.blocks, paired, tokens, o, row_end, y, rows, bias);
}

// ---- prefill from kRows16 weights: the decoding kernel above, kGroupTokens tokens at a time
//
// Each group's 16 rows (a few to 50 KB of blocks) stay in L1/L2 while every token of a chunk passes;
// a block's weight registers are loaded and unpacked once for kGroupTokens tokens. No rearranging of
// the weights (the tiles below gather every tile of rows again for every chunk of tokens: half the
// time of an MoE expert that sees 16 tokens), and a token's outputs are those decoding gives it alone.

constexpr int64_t kGroupTokens = 8;

/// Rows [row_begin, row_end) (whole kRows16 groups) for every token; y[t * out_features + o].
template <bool Q8>
TP_AVX512 void prefill_groups16_avx512(const uint8_t* w, int64_t row_bytes, const RowTokens& x, int64_t tokens,
                                       int64_t row_begin, int64_t row_end, float* y, int64_t out_features,
                                       const float* bias) {
  constexpr QuantFormat kFormat = Q8 ? QuantFormat::kQ8_0 : QuantFormat::kQ4_0;
  rows16::for_groups_and_tokens(
      w, row_bytes, x, tokens, row_begin, row_end, y, out_features, bias, kGroupTokens, 512 * 1024,
      [&](const uint8_t* group, const RowTokens& xt, float* out, const float* b, int64_t n) {
        switch (n) {
          case 8: decode_group_avx512<kFormat, 8>(group, xt, out, out_features, b); break;
          case 7: decode_group_avx512<kFormat, 7>(group, xt, out, out_features, b); break;
          case 6: decode_group_avx512<kFormat, 6>(group, xt, out, out_features, b); break;
          case 5: decode_group_avx512<kFormat, 5>(group, xt, out, out_features, b); break;
          case 4: decode_group_avx512<kFormat, 4>(group, xt, out, out_features, b); break;
          case 3: decode_group_avx512<kFormat, 3>(group, xt, out, out_features, b); break;
          case 2: decode_group_avx512<kFormat, 2>(group, xt, out, out_features, b); break;
          default: decode_group_avx512<kFormat, 1>(group, xt, out, out_features, b); break;
        }
      });
}

// ---- prefill (kTileTokens tokens or more): groups of 16 blocks, one block per int32 lane
//
// Register k of a group holds, in lane i, bytes 4k..4k+3 of block i: 8 dpbusd sum all 32 products of
// 16 blocks at once, lane by lane, and the scaling is one convert and one multiply-add per 16 blocks
// (per 2 in the decoding layout). Weights are rearranged per tile of rows (gathers), activations per
// token; both are reused many times.

constexpr int kGroup = 16;          // blocks per group
constexpr int kGroupWeightRegs = 9;  // per row and group: 8 of weights (unsigned, as decoding), the scales

/// Activations per token and group: 8 registers of q (zeros past the last block), the 16 blocks'
/// scales, and minus the weights' offset (Q8_0: 128, Q4_0: 8) times each block's sum of q.
struct GroupedTokens {
  int64_t groups;
  const __m512i* q;   // [(t * groups + g) * 8 + k]
  const __m512* d;    // [t * groups + g]
  const __m512i* init;  // [t * groups + g]
};

TP_AVX512 inline __m512i lane_offsets(int64_t stride) {
  return _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                            _mm512_set1_epi32(static_cast<int>(stride)));
}

TP_AVX512 void group_token_avx512(bool q8, const int8_t* q, const float* d, const int32_t* sum, int64_t blocks,
                                  __m512i* xq, __m512* dx, __m512i* init) {
  const __m512i offsets = lane_offsets(kBlock);
  for (int64_t g = 0; g * kGroup < blocks; ++g) {
    const int64_t n = std::min<int64_t>(kGroup, blocks - g * kGroup);
    const __mmask16 real = static_cast<__mmask16>((1u << n) - 1);
    const int8_t* base = q + g * kGroup * kBlock;
    for (int k = 0; k < 8; ++k) {
      const __m512i at = _mm512_add_epi32(offsets, _mm512_set1_epi32(4 * k));
      _mm512_store_si512(xq + g * 8 + k, _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), real, at, base, 1));
    }
    dx[g] = _mm512_maskz_loadu_ps(real, d + g * kGroup);
    const __m512i sums = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(real, sum + g * kGroup), q8 ? 7 : 3);
    init[g] = _mm512_sub_epi32(_mm512_setzero_si512(), sums);
  }
}

/// One row's group of up to 16 blocks into kGroupWeightRegs registers at `dst`. Lane i's block has its
/// fp16 scale at base + scales[i] and its quant word j (4 bytes) at base + quants[i] + j * step; Q8_0's
/// signed quants are flipped to w + 128.
template <bool Q8>
TP_AVX512 void gather_group(const uint8_t* base, __m512i scales, __m512i quants, int step, int64_t n,
                            __m512i* dst) {
  const __mmask16 real = static_cast<__mmask16>((1u << n) - 1);
  for (int k = 0; k < 8; ++k) {
    const int at = step * (Q8 ? k : k % 4);
    __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), real,
                                            _mm512_add_epi32(quants, _mm512_set1_epi32(at)), base, 1);
    if (Q8) {  // w + 128
      v = _mm512_xor_si512(v, _mm512_set1_epi8(-128));
    } else {  // weights 0..15 low nibbles, 16..31 high nibbles
      v = _mm512_and_si512(k < 4 ? v : _mm512_srli_epi32(v, 4), _mm512_set1_epi8(0x0f));
    }
    _mm512_store_si512(dst + k, v);
  }
  const __m512i halves = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), real, scales, base, 1);
  _mm512_store_ps(reinterpret_cast<float*>(dst + 8), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(halves)));
}

/// Rearranges rows [row0, row0 + nrows) of the weight `w` (`rows` rows, GGUF or kRows16) into
/// `packed`: kGroupWeightRegs registers per row and group, rows one after another.
template <bool Q8>
TP_AVX512 void group_rows_avx512(const uint8_t* w, QuantLayout layout, int64_t rows, int64_t row0, int nrows,
                                 int64_t blocks, __m512i* packed) {
  constexpr int64_t bytes = Q8 ? kQ8_0Bytes : kQ4_0Bytes;
  const int64_t row_bytes = blocks * bytes, groups = (blocks + kGroup - 1) / kGroup;
  const int64_t full = layout == QuantLayout::kRows16 ? rows / block::kGroupRows * block::kGroupRows : 0;
  const __m512i offsets = lane_offsets(bytes);
  for (int r = 0; r < nrows; ++r) {
    const int64_t row = row0 + r;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t n = std::min<int64_t>(kGroup, blocks - g * kGroup);
      __m512i* dst = packed + (r * groups + g) * kGroupWeightRegs;
      if (row >= full) {  // a GGUF row
        const __m512i scales = offsets, quants = _mm512_add_epi32(offsets, _mm512_set1_epi32(kScaleBytes));
        gather_group<Q8>(w + row * row_bytes + g * kGroup * bytes, scales, quants, 4, n, dst);
        continue;
      }
      alignas(64) int32_t scale_at[kGroup] = {}, quant_at[kGroup] = {};
      const int64_t lane = row % block::kGroupRows;
      for (int64_t i = 0; i < n; ++i) {
        const auto at = block::rows16_block(g * kGroup + i, blocks, bytes);
        scale_at[i] = static_cast<int32_t>(at.scales + 2 * lane);
        quant_at[i] = static_cast<int32_t>(at.quants + 4 * lane);
      }
      gather_group<Q8>(w + (row - lane) * row_bytes, _mm512_load_si512(scale_at), _mm512_load_si512(quant_at), 64,
                       n, dst);
    }
  }
}

/// Rows [0, RT) x tokens [t0, t0 + TT) from the rearranged rows `packed`: out[t * out_stride + r].
template <bool Q8, int RT, int TT>
TP_AVX512 void prefill_tile_avx512(const __m512i* packed, const GroupedTokens& x, int64_t t0, float* out,
                                   int64_t out_stride, const float* bias) {
  const int64_t groups = x.groups;
  __m512 acc[RT][TT];
  TP_UNROLL for (int r = 0; r < RT; ++r) {
    TP_UNROLL for (int t = 0; t < TT; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  for (int64_t g = 0; g < groups; ++g) {
    __m512i dot[RT][TT];
    TP_UNROLL for (int r = 0; r < RT; ++r) {
      TP_UNROLL for (int t = 0; t < TT; ++t) {
        dot[r][t] = _mm512_load_si512(x.init + (t0 + t) * groups + g);
      }
    }
    TP_UNROLL for (int k = 0; k < 8; ++k) {
      __m512i w[RT];
      TP_UNROLL for (int r = 0; r < RT; ++r) w[r] = _mm512_load_si512(packed + (r * groups + g) * kGroupWeightRegs + k);
      TP_UNROLL for (int t = 0; t < TT; ++t) {
        const __m512i xv = _mm512_load_si512(x.q + ((t0 + t) * groups + g) * 8 + k);
        TP_UNROLL for (int r = 0; r < RT; ++r) {
          dot[r][t] = _mm512_dpbusd_epi32(dot[r][t], w[r], xv);
        }
      }
    }
    TP_UNROLL for (int t = 0; t < TT; ++t) {
      const __m512 dv = _mm512_load_ps(reinterpret_cast<const float*>(x.d + (t0 + t) * groups + g));
      TP_UNROLL for (int r = 0; r < RT; ++r) {
        const __m512i* scales = packed + (r * groups + g) * kGroupWeightRegs + 8;
        const __m512 dw = _mm512_load_ps(reinterpret_cast<const float*>(scales));
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][t]), _mm512_mul_ps(dw, dv), acc[r][t]);
      }
    }
  }
  TP_UNROLL for (int t = 0; t < TT; ++t) {
    TP_UNROLL for (int r = 0; r < RT; ++r) {
      out[t * out_stride + r] = _mm512_reduce_add_ps(acc[r][t]) + (bias ? bias[r] : 0.0f);
    }
  }
}

template <bool Q8, int RT>
TP_AVX512 void prefill_rows_tokens(const __m512i* packed, const GroupedTokens& x, int64_t t_begin, int64_t t_end,
                                   float* y, int64_t out_stride, const float* bias) {
  int64_t t = t_begin;
  for (; t + kTileTokens <= t_end; t += kTileTokens) {
    prefill_tile_avx512<Q8, RT, kTileTokens>(packed, x, t, y + t * out_stride, out_stride, bias);
  }
  float* out = y + t * out_stride;
  switch (t_end - t) {
    case 3: prefill_tile_avx512<Q8, RT, 3>(packed, x, t, out, out_stride, bias); break;
    case 2: prefill_tile_avx512<Q8, RT, 2>(packed, x, t, out, out_stride, bias); break;
    case 1: prefill_tile_avx512<Q8, RT, 1>(packed, x, t, out, out_stride, bias); break;
    default: break;
  }
}

/// Output rows [row_begin, row_end) for every token; y[t * out_features + o]. Tokens in chunks whose
/// activations stay in L2; per chunk, each tile of rows rearranged once and used for every token.
template <bool Q8>
TP_AVX512 void prefill_rows_avx512(const uint8_t* w, int64_t blocks, QuantLayout layout,
                                   const GroupedTokens& x, int64_t tokens, int64_t row_begin, int64_t row_end, float* y,
                                   int64_t out_features, const float* bias) {
  if (row_begin >= row_end) return;
  const int64_t groups = x.groups;
  std::vector<uint8_t> buffer(kTileRows * groups * kGroupWeightRegs * sizeof(__m512i) + 64);
  const auto aligned = (reinterpret_cast<std::uintptr_t>(buffer.data()) + 63) & ~std::uintptr_t{63};
  __m512i* packed = reinterpret_cast<__m512i*>(aligned);
  const int64_t token_bytes = groups * 10 * static_cast<int64_t>(sizeof(__m512i));
  const int64_t chunk = std::max<int64_t>(kTileTokens, (384 * 1024 / token_bytes) / kTileTokens * kTileTokens);
  for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
    const int64_t t1 = std::min(tokens, t0 + chunk);
    for (int64_t o = row_begin; o < row_end; o += kTileRows) {
      const int nrows = static_cast<int>(std::min<int64_t>(kTileRows, row_end - o));
      group_rows_avx512<Q8>(w, layout, out_features, o, nrows, blocks, packed);
      const float* b = bias ? bias + o : nullptr;
      switch (nrows) {
        case 4: prefill_rows_tokens<Q8, 4>(packed, x, t0, t1, y + o, out_features, b); break;
        case 3: prefill_rows_tokens<Q8, 3>(packed, x, t0, t1, y + o, out_features, b); break;
        case 2: prefill_rows_tokens<Q8, 2>(packed, x, t0, t1, y + o, out_features, b); break;
        default: prefill_rows_tokens<Q8, 1>(packed, x, t0, t1, y + o, out_features, b); break;
      }
    }
  }
}

#undef TP_UNROLL
#undef TP_AVX512

// -- dispatch -------------------------------------------------------------------------------------------

using DotFn = float (*)(const uint8_t*, const QuantizedRow&, int64_t);

// F16C from CPUID leaf 1 (clang's __builtin_cpu_supports does not know it).
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

// AVX2 with FMA and F16C, unless ATEN_CPU_CAPABILITY caps the process below it (base/cpu_level.h).
bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c() &&
                          base::cpu_level_allowed(base::CpuLevel::kAvx2);
  return has;
}

// AVX-512 F/BW/VL (which __builtin_cpu_supports checks the OS saves too) and VNNI from CPUID leaf 7
// (clang 14's __builtin_cpu_supports does not know "avx512vnni").
bool cpu_has_avx512_vnni() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool vnni = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 11)) != 0;
    return vnni && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && cpu_has_avx2() && base::cpu_level_allowed(base::CpuLevel::kAvx512);
  }();
  return has;
}

std::atomic<QuantKernel> chosen_kernel{QuantKernel::kAuto};

// The kernel `kernel` stands for on this CPU: the requested one, else the best one below it.
QuantKernel resolve(QuantKernel kernel) {
  if (kernel == QuantKernel::kScalar) return kernel;
  if ((kernel == QuantKernel::kAuto || kernel == QuantKernel::kAvx512) && cpu_has_avx512_vnni()) {
    return QuantKernel::kAvx512;
  }
  return cpu_has_avx2() ? QuantKernel::kAvx2 : QuantKernel::kScalar;
}

DotFn dot_scalar_for(QuantFormat format) {
  switch (format) {
    case QuantFormat::kQ8_0: return dot32_scalar<QuantFormat::kQ8_0>;
    case QuantFormat::kQ4_0: return dot32_scalar<QuantFormat::kQ4_0>;
    case QuantFormat::kQ4_1: return dot32_scalar<QuantFormat::kQ4_1>;
    case QuantFormat::kQ5_0: return dot32_scalar<QuantFormat::kQ5_0>;
    case QuantFormat::kQ5_1: return dot32_scalar<QuantFormat::kQ5_1>;
    default: return nullptr;
  }
}

// One token's product splits on the decode team (base/parallel.h), cheap enough that small products
// split too; more tokens (prefill, batches) on LibTorch's threads, which its BLAS products use as well.
template <class Body>
void split_rows(int64_t tokens, int64_t begin, int64_t end, int64_t grain, const Body& body) {
  if (tokens == 1) {
    base::parallel_for(begin, end, grain, body);
  } else {
    at::parallel_for(begin, end, grain, body);
  }
}

// A product gets one part per this many bytes of weights (per token, rounded up), one per thread at
// most: smaller parts cost more to hand to another thread than they save.
constexpr int64_t kMinPartBytes = 64 * 1024;

at::Tensor linear_avx512(QuantFormat format, QuantLayout layout, const float* src, int64_t tokens, int64_t in,
                         const uint8_t* w, int64_t out_features, const float* bias, at::Tensor out) {
  const bool q8 = format == QuantFormat::kQ8_0;
  if (tokens == 0 || out_features == 0) return out;
  const int64_t blocks = in / kBlock;
  const int64_t row_bytes = blocks * block_bytes(format);
  float* y = out.data_ptr<float>();
  // The threads take whole kRows16 groups of rows (so whole tiles; the last group may be short).
  constexpr int64_t kRows = block::kGroupRows;
  static_assert(kRows % kTileRows == 0, "a part is whole tiles");
  const int64_t row_groups = (out_features + kRows - 1) / kRows;
  const int64_t min_groups = std::max<int64_t>(1, kMinPartBytes / (kRows * row_bytes * tokens));
  const auto for_rows = [&](const auto& body) {
    split_rows(tokens, 0, row_groups, min_groups,
               [&](int64_t begin, int64_t end) { body(begin * kRows, std::min(out_features, end * kRows)); });
  };
  // Every token's activations quantized once. kRows16's whole groups read them as they are (plus
  // each block's offset); the other rows (every row of GGUF weights, kRows16's tail rows) read them
  // rearranged for their kernel, built only when such rows exist: regrouped 16 blocks to a register
  // for the tiles (prefill), expanded per pair of blocks for the pair kernel (decoding).
  const int64_t grouped_rows = layout == QuantLayout::kRows16 ? out_features / block::kGroupRows * block::kGroupRows : 0;
  const bool prefill = tokens >= kTileTokens;
  const bool other_rows = grouped_rows < out_features;
  std::vector<int8_t> q(tokens * in);
  std::vector<float> d(tokens * blocks);
  std::vector<int32_t> sums(tokens * blocks);
  const int64_t groups = prefill && other_rows ? (blocks + kGroup - 1) / kGroup : 0;
  // 64-byte aligned registers' worth: LibTorch's allocator aligns to 64 bytes.
  const at::Tensor grouped = groups > 0 ? at::empty({tokens * groups * (8 + 1 + 1) * 64}, at::kByte) : at::Tensor();
  auto* gq = groups > 0 ? reinterpret_cast<__m512i*>(grouped.data_ptr<uint8_t>()) : nullptr;
  auto* gd = reinterpret_cast<__m512*>(gq + tokens * groups * 8);
  auto* ginit = reinterpret_cast<__m512i*>(gd + tokens * groups);
  // Decoding's few tokens stay on the calling thread (grain kTileTokens).
  at::parallel_for(0, tokens, kTileTokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      quantize_activations_avx512(src + t * in, in, q.data() + t * in, d.data() + t * blocks, sums.data() + t * blocks);
      if (groups > 0) {
        group_token_avx512(q8, q.data() + t * in, d.data() + t * blocks, sums.data() + t * blocks, blocks,
                           gq + t * groups * 8, gd + t * groups, ginit + t * groups);
      }
    }
  });
  const block::Layout32 block_layout = block::layout32(format);
  std::vector<int32_t> offsets(grouped_rows > 0 ? tokens * blocks : 0);
  std::vector<float> x_sums(grouped_rows > 0 && block_layout.stored_b ? tokens * blocks : 0);
  for (std::size_t i = 0; i < offsets.size(); ++i) offsets[i] = -block_layout.offset * sums[i];
  for (std::size_t i = 0; i < x_sums.size(); ++i) x_sums[i] = d[i] * static_cast<float>(sums[i]);
  const RowTokens x{blocks, q.data(), d.data(), offsets.data(), x_sums.data()};

  if (!prefill) {
    const int64_t pairs = other_rows ? (blocks + 1) / 2 : 0;
    std::vector<int8_t> xq(tokens * pairs * kPairBytes);
    std::vector<float> dx(tokens * pairs * 16), pair_sums(block_layout.stored_b ? tokens * pairs * 16 : 0);
    std::vector<int32_t> pair_init(tokens * pairs * 16);
    for (int64_t t = 0; t < tokens && pairs > 0; ++t) {
      pair_token_avx512(block_layout, q.data() + t * in, d.data() + t * blocks, sums.data() + t * blocks, blocks,
                        xq.data() + t * pairs * kPairBytes, dx.data() + t * pairs * 16, pair_init.data() + t * pairs * 16,
                        pair_sums.data() + (block_layout.stored_b ? t * pairs * 16 : 0));
    }
    const PairedTokens paired{pairs, xq.data(), dx.data(), pair_init.data(), pair_sums.data()};
    for_rows([&](int64_t row_begin, int64_t row_end) {
      switch (format) {
        case QuantFormat::kQ8_0:
          decode_avx512<QuantFormat::kQ8_0>(w, row_bytes, out_features, grouped_rows, x, paired, tokens, row_begin,
                                            row_end, y, bias);
          break;
        case QuantFormat::kQ4_0:
          decode_avx512<QuantFormat::kQ4_0>(w, row_bytes, out_features, grouped_rows, x, paired, tokens, row_begin,
                                            row_end, y, bias);
          break;
        case QuantFormat::kQ4_1:
          decode_avx512<QuantFormat::kQ4_1>(w, row_bytes, out_features, grouped_rows, x, paired, tokens, row_begin,
                                            row_end, y, bias);
          break;
        case QuantFormat::kQ5_0:
          decode_avx512<QuantFormat::kQ5_0>(w, row_bytes, out_features, grouped_rows, x, paired, tokens, row_begin,
                                            row_end, y, bias);
          break;
        case QuantFormat::kQ5_1:
          decode_avx512<QuantFormat::kQ5_1>(w, row_bytes, out_features, grouped_rows, x, paired, tokens, row_begin,
                                            row_end, y, bias);
          break;
        default: break;
      }
    });
    return out;
  }
  const GroupedTokens regrouped{groups, gq, gd, ginit};
  for_rows([&](int64_t row_begin, int64_t row_end) {
    const int64_t split = std::clamp(grouped_rows, row_begin, row_end);
    if (q8) {
      prefill_groups16_avx512<true>(w, row_bytes, x, tokens, row_begin, split, y, out_features, bias);
      prefill_rows_avx512<true>(w, blocks, layout, regrouped, tokens, split, row_end, y, out_features, bias);
    } else {
      prefill_groups16_avx512<false>(w, row_bytes, x, tokens, row_begin, split, y, out_features, bias);
      prefill_rows_avx512<false>(w, blocks, layout, regrouped, tokens, split, row_end, y, out_features, bias);
    }
  });
  return out;
}

// AVX2: kRows16's whole groups 16 rows at a time (quant_rows16_avx2.cpp); GGUF rows (every row of
// kBlocks weights, kRows16's tail rows) in tiles of 4 rows x 2 tokens.
at::Tensor linear_avx2(QuantFormat format, QuantLayout layout, const float* src, int64_t tokens, int64_t in,
                       const uint8_t* w, int64_t out_features, const float* bias, at::Tensor out) {
  if (tokens == 0 || out_features == 0) return out;
  const int64_t blocks = in / kBlock;
  const int64_t row_bytes = blocks * block_bytes(format);
  std::vector<int8_t> q(tokens * in);
  std::vector<float> d(tokens * blocks);
  std::vector<int32_t> sums(tokens * blocks);
  at::parallel_for(0, tokens, kTileTokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      rows16::quantize_activations_avx2(src + t * in, in, q.data() + t * in, d.data() + t * blocks,
                                        sums.data() + t * blocks);
    }
  });
  constexpr int64_t kRows = block::kGroupRows;
  const int64_t grouped_rows = layout == QuantLayout::kRows16 ? out_features / kRows * kRows : 0;
  // The kRows16 kernel multiplies Q8_0's weights signed, the others' unsigned (Q4_0's offset 8 and
  // Q5_0's 16 taken off through init), and adds a stored offset m times d_x sum(x_q).
  const block::Layout32 block_layout = block::layout32(format);
  const int32_t offset = format == QuantFormat::kQ8_0 ? 0 : block_layout.offset;
  std::vector<int32_t> init(grouped_rows > 0 ? tokens * blocks : 0);
  std::vector<float> x_sums(grouped_rows > 0 && block_layout.stored_b ? tokens * blocks : 0);
  for (std::size_t i = 0; i < init.size(); ++i) init[i] = -offset * sums[i];
  for (std::size_t i = 0; i < x_sums.size(); ++i) x_sums[i] = d[i] * static_cast<float>(sums[i]);
  const RowTokens grouped{blocks, q.data(), d.data(), init.data(), x_sums.data()};
  std::vector<QuantizedRow> rows(tokens);
  for (int64_t t = 0; t < tokens; ++t) rows[t] = {q.data() + t * in, d.data() + t * blocks, sums.data() + t * blocks};
  const TilesFn tiles = tiles_avx2_for(format);
  float* y = out.data_ptr<float>();
  const int64_t row_groups = (out_features + kRows - 1) / kRows;
  const int64_t min_groups = std::max<int64_t>(1, kMinPartBytes / (kRows * row_bytes * tokens));
  split_rows(tokens, 0, row_groups, min_groups, [&](int64_t begin, int64_t end) {
    const int64_t row_begin = begin * kRows, row_end = std::min(out_features, end * kRows);
    const int64_t split = std::clamp(grouped_rows, row_begin, row_end);
    if (split > row_begin) {
      rows16::product_avx2(format, w, row_bytes, grouped, tokens, row_begin, split, y,
                           out_features, bias);
    }
    if (row_end > split) tiles(w, row_bytes, rows, blocks, split, row_end, y, out_features, bias);
  });
  return out;
}

void check_operands(QuantFormat format, const at::Tensor& x, const at::Tensor& blocks, int64_t out_features,
                    const at::Tensor& bias) {
  const int64_t bytes = block_bytes(format), weights = block_weights(format);
  const int64_t in = x.dim() == 0 ? 0 : x.size(-1);
  if (x.scalar_type() != at::kFloat || in % weights != 0 || in == 0) {
    throw InputError(fmt::format("{} linear: input must be float32 [..., a multiple of {}], not {} {}",
                                 format_name(format), weights, c10::toString(x.scalar_type()), fmt::join(x.sizes(), "x")));
  }
  if (blocks.scalar_type() != at::kByte || blocks.dim() != 2 || blocks.size(0) != out_features ||
      blocks.size(1) != in / weights * bytes || !blocks.is_contiguous()) {
    throw InputError(fmt::format("{} linear: weight blocks must be contiguous uint8 [{}, {}] for input {}, not {} {}",
                                 format_name(format), out_features, in / weights * bytes, in,
                                 c10::toString(blocks.scalar_type()), fmt::join(blocks.sizes(), "x")));
  }
  if (bias.defined() && (bias.scalar_type() != at::kFloat || bias.dim() != 1 || bias.size(0) != out_features)) {
    throw InputError(fmt::format("{} linear: bias must be float32 [{}], not {} {}", format_name(format), out_features,
                                 c10::toString(bias.scalar_type()), fmt::join(bias.sizes(), "x")));
  }
}

}  // namespace

QuantKernel set_quant_kernel(QuantKernel kernel) { return chosen_kernel.exchange(kernel); }

QuantKernel ggml::resolved_quant_kernel() { return resolve(chosen_kernel.load()); }

QuantKernel active_quant_kernel() { return resolve(chosen_kernel.load()); }

const char* quant_kernel_name(QuantKernel kernel) {
  switch (kernel) {
    case QuantKernel::kAuto: return "auto";
    case QuantKernel::kScalar: return "scalar";
    case QuantKernel::kAvx2: return "avx2";
    case QuantKernel::kAvx512: return "avx512";
  }
  return "?";
}

std::optional<QuantKernel> parse_quant_kernel(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto kernel : {QuantKernel::kAuto, QuantKernel::kScalar, QuantKernel::kAvx2, QuantKernel::kAvx512}) {
    if (lower == quant_kernel_name(kernel)) return kernel;
  }
  return std::nullopt;
}

bool quant_kernel_available(QuantKernel kernel) {
  switch (kernel) {
    case QuantKernel::kAvx2: return cpu_has_avx2();
    case QuantKernel::kAvx512: return cpu_has_avx512_vnni();
    default: return true;
  }
}

at::Tensor quant_linear(QuantFormat format, const at::Tensor& x, const at::Tensor& blocks, int64_t out_features,
                        const at::Tensor& bias, QuantLayout layout) {
  if (x.is_cuda() || blocks.is_cuda()) {
    if (!quantizes_to(format)) {
      throw InputError(fmt::format("{} linear runs on the CPU only (CUDA multiplies q8_0 and q4_0 blocks); load the "
                                   "model with --dequantize to run it in float on the GPU",
                                   format_name(format)));
    }
    if (layout != QuantLayout::kBlocks) {
      throw InputError(fmt::format("{} linear on CUDA reads GGUF's blocks (QuantLayout::kBlocks), not kRows16",
                                   format_name(format)));
    }
    return cuda_quant_linear(format, x, blocks, out_features, bias);
  }
  check_operands(format, x, blocks, out_features, bias);
  const int64_t in = x.size(-1);
  const int64_t tokens = x.numel() / in;
  const int64_t per_row = in / kBlock;
  const at::Tensor input = x.contiguous();
  const float* src = input.data_ptr<float>();
  std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end());
  out_sizes.back() = out_features;
  at::Tensor out = at::empty(out_sizes, at::kFloat);
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  const at::Tensor bias_values = bias.defined() ? bias.contiguous() : at::Tensor();
  const float* b = bias_values.defined() ? bias_values.data_ptr<float>() : nullptr;
  const QuantKernel kernel = resolve(chosen_kernel.load());
  if (layout == QuantLayout::kRows16 && !block::has_rows16(format)) {
    throw InputError(fmt::format("{} linear reads GGUF's blocks (QuantLayout::kBlocks) only", format_name(format)));
  }
  if (!quantizes_to(format)) {
    // Decoding's few tokens with the 32-weight formats quantize their activations like the rest of
    // this file (as llama.cpp does); prompts, and the K-quants, multiply float activations.
    if (!block::is_block32(format) || tokens >= kTileTokens) {
      ggml::linear(format, kernel, src, tokens, in, w, out_features, b, out.data_ptr<float>(), layout);
      return out;
    }
  }
  if (kernel == QuantKernel::kAvx512) return linear_avx512(format, layout, src, tokens, in, w, out_features, b, out);
  if (kernel == QuantKernel::kAvx2) return linear_avx2(format, layout, src, tokens, in, w, out_features, b, out);
  // The scalar kernel reads GGUF rows only.
  const at::Tensor gguf = layout == QuantLayout::kRows16 ? unpack_blocks(format, blocks, "weight") : blocks;
  w = gguf.data_ptr<uint8_t>();

  // Every token's activations quantized once, shared by all output rows.
  std::vector<int8_t> q(tokens * in);
  std::vector<float> d(tokens * per_row);
  std::vector<int32_t> sums(tokens * per_row);
  at::parallel_for(0, tokens, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      quantize_activations(src + t * in, in, q.data() + t * in, d.data() + t * per_row, sums.data() + t * per_row);
    }
  });

  float* y = out.data_ptr<float>();
  const int64_t row_bytes = blocks.size(1);
  const DotFn dot = dot_scalar_for(format);
  // Each weight row is read once from memory and reused from cache for every token.
  split_rows(tokens, 0, out_features, 16, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      for (int64_t t = 0; t < tokens; ++t) {
        const QuantizedRow row{q.data() + t * in, d.data() + t * per_row, sums.data() + t * per_row};
        y[t * out_features + o] = dot(w + o * row_bytes, row, per_row) + (b ? b[o] : 0.0f);
      }
    }
  });
  return out;
}

}  // namespace torchpatch::nn
