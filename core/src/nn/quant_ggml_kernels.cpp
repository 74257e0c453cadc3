// Products of float activations with GGUF blocks (nn/quant_ggml.h): each weight row unpacked once
// into bytes q (natural order) and a, b per 16 weights, dequantized to float in cache, then dotted with
// every token's float activations. One token (decoding) of a 32-weight format is multiplied in
// registers without a copy; a few tokens go row by row; a prompt's many tokens take tiles of rows
// dequantized once and multiplied by LibTorch's matrix product.
//
// Unpacking has a plain C++ form (the scalar kernel) and one with AVX2's byte operations (AVX2 and
// AVX-512: 32 weights per instruction, then 8 converted to float and scaled per multiply-add); the
// dot products are written out per instruction set. Measured: the compiler's own vectorization of
// the plain loops gathered bytes one by one, several times slower than the float32 model.
#include "nn/quant_ggml.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include "base/parallel.h"
#include "base/x86_intrinsics.h"
#include "nn/quant_block.h"
#include "nn/quant_unpack32.h"

namespace torchpatch::nn::ggml {

namespace {

using block::bit_bytes_avx2;
using block::load_word;

constexpr int64_t kGroup = 16;  // weights sharing one a and one b

#define TP_ALWAYS_INLINE inline __attribute__((always_inline))
#define TP_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TP_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

// Every fp16 value as float32: one load per scale, where converting bits costs a dozen instructions
// (a sixth of a Q4_1 row's decoding, measured) and F16C is not in every kernel here.
struct HalfTable {
  HalfTable() {
    for (uint32_t h = 0; h < 65536; ++h) values[h] = c10::detail::fp16_ieee_to_fp32_value(static_cast<uint16_t>(h));
  }
  float values[65536];
};
const HalfTable kHalves;

TP_ALWAYS_INLINE float half(const uint8_t* p) { return kHalves.values[p[0] | p[1] << 8]; }

// -- unpacking one block: bytes q [block weights] and a, b [block weights / 16] ------------------------------
//
// `scales` reads a and b; `bytes` the quants in natural order, once in plain C++ and once with AVX2's
// byte operations (32 weights per instruction; the AVX-512 kernel uses them too).

// The 32-weight formats' layouts: nn/quant_block.h.
template <QuantFormat F>
constexpr block::Layout32 kLayout32 = block::layout32(F);

template <QuantFormat F>
constexpr bool block_is_32() {
  return block::is_block32(F);
}

// b of a 32-weight block whose scale is d.
template <QuantFormat F>
TP_ALWAYS_INLINE float offset32(const uint8_t* blk, float d) {
  return kLayout32<F>.stored_b ? half(blk + 2) : static_cast<float>(-kLayout32<F>.offset) * d;
}

// Q2_K [16 scales: d-nibble | m-nibble << 4][64: 2-bit quants][d][dmin]: weight 128 h + 32 s + l is
// bits 2s of byte 32 h + l; w = d sc q - dmin m per 16.
// Q3_K [32 hmask][64: 2-bit quants as Q2_K][12: 16 six-bit scales][d]: the third bit is bit v / 32
// of hmask[v % 32]; w = d (scale - 32) (q - 4), q = the two bits plus 4 times the third.
// Q4_K [d][dmin][12: eight 6-bit scales and mins][(Q5_K: 32 qh)][128 nibbles]: weight 64 c + 32 n + l
// is nibble n of byte 32 c + l (Q5_K: fifth bit 2c + n of qh[l]); w = d sc q - dmin m per 32.
// Q6_K [128 low nibbles][64 high pairs][16 int8 scales][d]: weight 128 h + 32 k + l has low nibble k / 2
// of ql[64 h + 32 (k % 2) + l], high bits 2k of qh[32 h + l]; w = d sc (q - 32) per 16.

template <QuantFormat F>
TP_ALWAYS_INLINE void scales(const uint8_t* __restrict blk, float* __restrict a, float* __restrict b) {
  if constexpr (F == QuantFormat::kQ2_K) {
    const float d = half(blk + 80), dmin = half(blk + 82);
    for (int g = 0; g < 16; ++g) {
      a[g] = d * static_cast<float>(blk[g] & 0xF);
      b[g] = -(dmin * static_cast<float>(blk[g] >> 4));
    }
  } else if constexpr (F == QuantFormat::kQ3_K) {
    const uint8_t* sc = blk + 96;
    const float d = half(blk + 108);
    for (int g = 0; g < 16; ++g) {
      const int low = (sc[g % 8] >> (g < 8 ? 0 : 4)) & 0xF, high = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
      a[g] = d * static_cast<float>((low | high << 4) - 32);
      b[g] = -4.0f * a[g];
    }
  } else if constexpr (F == QuantFormat::kQ4_K || F == QuantFormat::kQ5_K) {
    const float d = half(blk), dmin = half(blk + 2);
    const uint8_t* s = blk + 4;
    for (int j = 0; j < 8; ++j) {
      const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
      const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
      a[2 * j] = a[2 * j + 1] = d * static_cast<float>(sc);
      b[2 * j] = b[2 * j + 1] = -(dmin * static_cast<float>(m));
    }
  } else if constexpr (F == QuantFormat::kQ6_K) {
    const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const float d = half(blk + 208);
    for (int g = 0; g < 16; ++g) {
      a[g] = d * static_cast<float>(sc[g]);
      b[g] = -32.0f * a[g];
    }
  } else {
    const float d = half(blk);
    a[0] = a[1] = d;
    b[0] = b[1] = offset32<F>(blk, d);
  }
}

template <QuantFormat F>
TP_ALWAYS_INLINE void bytes(const uint8_t* __restrict blk, uint8_t* __restrict q) {
  if constexpr (F == QuantFormat::kQ2_K || F == QuantFormat::kQ3_K) {
    const uint8_t* qs = blk + (F == QuantFormat::kQ2_K ? 16 : 32);
    for (int h = 0; h < 2; ++h) {
      for (int s = 0; s < 4; ++s) {
        for (int l = 0; l < 32; ++l) {
          const int third = F == QuantFormat::kQ3_K ? ((blk[l] >> (4 * h + s)) & 1) << 2 : 0;  // hmask first
          q[128 * h + 32 * s + l] = static_cast<uint8_t>(((qs[32 * h + l] >> (2 * s)) & 3) | third);
        }
      }
    }
  } else if constexpr (F == QuantFormat::kQ4_K || F == QuantFormat::kQ5_K) {
    constexpr bool five = F == QuantFormat::kQ5_K;
    const uint8_t* qh = blk + 16;
    const uint8_t* qs = blk + (five ? 48 : 16);
    for (int c = 0; c < 4; ++c) {
      for (int n = 0; n < 2; ++n) {
        for (int l = 0; l < 32; ++l) {
          q[64 * c + 32 * n + l] = static_cast<uint8_t>(((qs[32 * c + l] >> (4 * n)) & 0xF) |
                                                        (five ? ((qh[l] >> (2 * c + n)) & 1) << 4 : 0));
        }
      }
    }
  } else if constexpr (F == QuantFormat::kQ6_K) {
    const uint8_t* ql = blk;
    const uint8_t* qh = blk + 128;
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 4; ++k) {
        for (int l = 0; l < 32; ++l) {
          q[128 * h + 32 * k + l] = static_cast<uint8_t>(((ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF) |
                                                         ((qh[32 * h + l] >> (2 * k)) & 3) << 4);
        }
      }
    }
  } else {
    block::unpack32<F>(blk, q);
  }
}

// Bits of `v`'s bytes shifted right by `n`, masked to `mask` (the shift is per 16-bit word; the mask
// drops what came over from the neighbouring byte).
TP_AVX2 inline __m256i bits_avx2(__m256i v, int n, int mask) {
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(n)), _mm256_set1_epi8(static_cast<char>(mask)));
}

TP_AVX2 inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

TP_AVX2 inline void store32(uint8_t* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }

template <QuantFormat F>
TP_AVX2 TP_ALWAYS_INLINE void bytes_avx2(const uint8_t* __restrict blk, uint8_t* __restrict q) {
  if constexpr (F == QuantFormat::kQ2_K || F == QuantFormat::kQ3_K) {
    const uint8_t* qs = blk + (F == QuantFormat::kQ2_K ? 16 : 32);
    const __m256i hmask = load32(blk);
    for (int h = 0; h < 2; ++h) {
      const __m256i v = load32(qs + 32 * h);
      for (int s = 0; s < 4; ++s) {
        __m256i out = bits_avx2(v, 2 * s, 3);
        if constexpr (F == QuantFormat::kQ3_K) out = _mm256_or_si256(out, _mm256_slli_epi16(bits_avx2(hmask, 4 * h + s, 1), 2));
        store32(q + 128 * h + 32 * s, out);
      }
    }
  } else if constexpr (F == QuantFormat::kQ4_K || F == QuantFormat::kQ5_K) {
    constexpr bool five = F == QuantFormat::kQ5_K;
    const __m256i qh = load32(blk + 16);
    for (int c = 0; c < 4; ++c) {
      const __m256i v = load32(blk + (five ? 48 : 16) + 32 * c);
      for (int n = 0; n < 2; ++n) {
        __m256i out = bits_avx2(v, 4 * n, 0xF);
        if constexpr (five) out = _mm256_or_si256(out, _mm256_slli_epi16(bits_avx2(qh, 2 * c + n, 1), 4));
        store32(q + 64 * c + 32 * n, out);
      }
    }
  } else if constexpr (F == QuantFormat::kQ6_K) {
    for (int h = 0; h < 2; ++h) {
      const __m256i qh = load32(blk + 128 + 32 * h);
      for (int k = 0; k < 4; ++k) {
        const __m256i low = bits_avx2(load32(blk + 64 * h + 32 * (k % 2)), 4 * (k / 2), 0xF);
        store32(q + 128 * h + 32 * k, _mm256_or_si256(low, _mm256_slli_epi16(bits_avx2(qh, 2 * k, 3), 4)));
      }
    }
  } else {
    store32(q, block::quants32_avx2<F>(blk));
  }
}

// -- the problem ------------------------------------------------------------------------------------------

struct Problem {
  int64_t tokens, in, out_features;
  int64_t row_bytes, blocks, weights, bytes;  // per row: bytes, blocks; per block: weights, bytes
  int64_t groups;                             // in / 16
  QuantFormat format;
  int64_t grouped_rows = 0;  // the first rows, in kRows16 groups (nn/quant.h); the others GGUF rows
  const uint8_t* w;
  const float* x;       // [tokens, in]
  const float* x_sums = nullptr;  // one token: the sum of x per block (32-weight formats) or group of 16
  const float* bias;
  float* y;  // [tokens, out_features]
};

/// Per part of the rows: a row's bytes q [in], a and b [in / 16]; a GGUF row copied out of a kRows16 group.
struct Scratch {
  explicit Scratch(const Problem& p) : q(p.in), a(p.groups), b(p.groups), row(p.grouped_rows > 0 ? p.row_bytes : 0) {}
  std::vector<uint8_t> q;
  std::vector<float> a, b;
  std::vector<uint8_t> row;
};

// Row `o`'s blocks as a GGUF row: where they lie, or copied out of their kRows16 group into `s`.
const uint8_t* gguf_row(const Problem& p, int64_t o, Scratch& s) {
  if (o >= p.grouped_rows) return p.w + o * p.row_bytes;
  const int64_t first = o / block::kGroupRows * block::kGroupRows;
  block::copy_row_from_group(p.format, p.w + first * p.row_bytes, o - first, p.blocks, s.row.data());
  return s.row.data();
}

// Row `o` of W as float32 into `out` [in]: unpacked into `s`, then a q + b per 16 weights.
template <QuantFormat F>
void dequantize_row_scalar(const Problem& p, int64_t o, Scratch& s, float* __restrict out) {
  const uint8_t* row = gguf_row(p, o, s);
  const int64_t per_block = p.weights / kGroup;
  for (int64_t k = 0; k < p.blocks; ++k) {
    scales<F>(row + k * p.bytes, s.a.data() + k * per_block, s.b.data() + k * per_block);
    bytes<F>(row + k * p.bytes, s.q.data() + k * p.weights);
  }
  for (int64_t g = 0; g < p.groups; ++g) {
    for (int64_t j = 0; j < kGroup; ++j) out[g * kGroup + j] = s.a[g] * static_cast<float>(s.q[g * kGroup + j]) + s.b[g];
  }
}

template <QuantFormat F>
TP_AVX2 void dequantize_row_avx2(const Problem& p, int64_t o, Scratch& s, float* __restrict out) {
  const uint8_t* row = gguf_row(p, o, s);
  const int64_t per_block = p.weights / kGroup;
  for (int64_t k = 0; k < p.blocks; ++k) {
    scales<F>(row + k * p.bytes, s.a.data() + k * per_block, s.b.data() + k * per_block);
    bytes_avx2<F>(row + k * p.bytes, s.q.data() + k * p.weights);
  }
  for (int64_t g = 0; g < p.groups; ++g) {
    const __m256 a = _mm256_set1_ps(s.a[g]), b = _mm256_set1_ps(s.b[g]);
    for (int64_t j = 0; j < kGroup; j += 8) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s.q.data() + g * kGroup + j));
      const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q8));
      _mm256_storeu_ps(out + g * kGroup + j, _mm256_fmadd_ps(q, a, b));
    }
  }
}

// One row dotted with one token without a float copy of the row (decoding). Every weight is a q + b
// with a, b shared by a group, so the product is the sum over groups of a (q . x) + b sum(x): the
// quants are converted and multiplied with x as they are, a scales each group's sum once, and the
// groups' sums of x are made once per token for every row (Problem::x_sums).

// The sum of four accumulators' lanes.
TP_AVX2 TP_ALWAYS_INLINE float sum4_avx2(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 acc = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// 8 quants (the low 8 bytes of q; int8 when Signed, else unsigned) as float.
template <bool Signed>
TP_AVX2 TP_ALWAYS_INLINE __m256 quants8_avx2(__m128i q) {
  return _mm256_cvtepi32_ps(Signed ? _mm256_cvtepi8_epi32(q) : _mm256_cvtepu8_epi32(q));
}

// One 32-weight block's quants, 0-15 in lo and 16-31 in hi (Q8_0: its int8, else unsigned), and b
// times x_sum added to offsets; returns the block's d.
template <QuantFormat F>
TP_AVX2 TP_ALWAYS_INLINE float unpack32_avx2(const uint8_t* blk, float x_sum, __m128i& lo, __m128i& hi, float& offsets) {
  constexpr block::Layout32 L = kLayout32<F>;
  const float d = half(blk);
  if constexpr (F == QuantFormat::kQ8_0) {  // d q: no offset
    lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18));
    return d;
  }
  const __m128i nibble = _mm_set1_epi8(0xF);
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + L.quants));
  lo = _mm_and_si128(qs, nibble);
  hi = _mm_and_si128(_mm_srli_epi16(qs, 4), nibble);
  if constexpr (L.fifth >= 0) {
    const __m256i fifth = bit_bytes_avx2(load_word(blk + L.fifth), 16);
    lo = _mm_or_si128(lo, _mm256_castsi256_si128(fifth));
    hi = _mm_or_si128(hi, _mm256_extracti128_si256(fifth, 1));
  }
  offsets += offset32<F>(blk, d) * x_sum;
  return d;
}

// One 32-weight block of a row, for one token: acc += d (q . x), offsets += b (the block's sum of x).
template <QuantFormat F>
TP_AVX2 TP_ALWAYS_INLINE void block32_avx2(const uint8_t* blk, const float* x, float x_sum, __m256& acc,
                                           float& offsets) {
  constexpr bool kSigned = F == QuantFormat::kQ8_0;
  __m128i lo, hi;
  const float d = unpack32_avx2<F>(blk, x_sum, lo, hi, offsets);
  __m256 s = _mm256_mul_ps(quants8_avx2<kSigned>(lo), _mm256_loadu_ps(x));
  __m256 t = _mm256_mul_ps(quants8_avx2<kSigned>(hi), _mm256_loadu_ps(x + 16));
  s = _mm256_fmadd_ps(quants8_avx2<kSigned>(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), s);
  t = _mm256_fmadd_ps(quants8_avx2<kSigned>(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), t);
  acc = _mm256_fmadd_ps(_mm256_add_ps(s, t), _mm256_set1_ps(d), acc);
}

// The 32-weight formats, in registers only: two blocks per step on two chains of multiply-adds.
// Per 32 weights four conversions, four multiply-adds and one scaling, against eight multiply-adds when
// each weight was scaled first (SmolLM2's decode, one thread: 57 tok/s that way).
template <QuantFormat F>
TP_AVX2 float fused_dot32_avx2(const Problem& p, int64_t o, const float* __restrict x) {
  const uint8_t* blk = p.w + o * p.row_bytes;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float offsets0 = 0.0f, offsets1 = 0.0f;
  int64_t k = 0;
  for (; k + 2 <= p.blocks; k += 2, blk += 2 * p.bytes, x += 64) {
    block32_avx2<F>(blk, x, p.x_sums[k], acc0, offsets0);
    block32_avx2<F>(blk + p.bytes, x + 32, p.x_sums[k + 1], acc1, offsets1);
  }
  if (k < p.blocks) block32_avx2<F>(blk, x, p.x_sums[k], acc0, offsets0);
  return sum4_avx2(acc0, acc1, _mm256_setzero_ps(), _mm256_setzero_ps()) + (offsets0 + offsets1);
}

// block32_avx2 and fused_dot32_avx2 on 16 lanes: half the instructions per block.
template <QuantFormat F>
TP_AVX512 TP_ALWAYS_INLINE void block32_avx512(const uint8_t* blk, const float* x, float x_sum, __m512& acc,
                                               float& offsets) {
  constexpr bool kSigned = F == QuantFormat::kQ8_0;
  __m128i lo, hi;
  const float d = unpack32_avx2<F>(blk, x_sum, lo, hi, offsets);
  const __m512 qlo = _mm512_cvtepi32_ps(kSigned ? _mm512_cvtepi8_epi32(lo) : _mm512_cvtepu8_epi32(lo));
  const __m512 qhi = _mm512_cvtepi32_ps(kSigned ? _mm512_cvtepi8_epi32(hi) : _mm512_cvtepu8_epi32(hi));
  const __m512 s = _mm512_fmadd_ps(qhi, _mm512_loadu_ps(x + 16), _mm512_mul_ps(qlo, _mm512_loadu_ps(x)));
  acc = _mm512_fmadd_ps(s, _mm512_set1_ps(d), acc);
}

template <QuantFormat F>
TP_AVX512 float fused_dot32_avx512(const Problem& p, int64_t o, const float* __restrict x) {
  const uint8_t* blk = p.w + o * p.row_bytes;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  float offsets0 = 0.0f, offsets1 = 0.0f;
  int64_t k = 0;
  for (; k + 2 <= p.blocks; k += 2, blk += 2 * p.bytes, x += 64) {
    block32_avx512<F>(blk, x, p.x_sums[k], acc0, offsets0);
    block32_avx512<F>(blk + p.bytes, x + 32, p.x_sums[k + 1], acc1, offsets1);
  }
  if (k < p.blocks) block32_avx512<F>(blk, x, p.x_sums[k], acc0, offsets0);
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + (offsets0 + offsets1);
}

// The K-quants: per block of 256 its bytes and scales in cache, then per group of 16 a (q . x) on
// four chains of multiply-adds, and b (the group's sum of x) for the block's 16 groups in two.
template <QuantFormat F>
TP_AVX2 float fused_dot_avx2(const Problem& p, int64_t o, const float* __restrict x) {
  if constexpr (block_is_32<F>()) return fused_dot32_avx2<F>(p, o, x);
  alignas(32) uint8_t q[256];
  alignas(32) float a[16], b[16];
  const uint8_t* row = p.w + o * p.row_bytes;
  const float* sums = p.x_sums;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  __m256 offsets = _mm256_setzero_ps();
  for (int64_t k = 0; k < p.blocks; ++k, x += p.weights, sums += 16) {
    scales<F>(row + k * p.bytes, a, b);
    bytes_avx2<F>(row + k * p.bytes, q);
    for (int g = 0; g < 16; g += 2) {
      const __m128i even = _mm_load_si128(reinterpret_cast<const __m128i*>(q + g * kGroup));
      const __m128i odd = _mm_load_si128(reinterpret_cast<const __m128i*>(q + (g + 1) * kGroup));
      const __m256 e = _mm256_fmadd_ps(quants8_avx2<false>(_mm_srli_si128(even, 8)), _mm256_loadu_ps(x + g * kGroup + 8),
                                       _mm256_mul_ps(quants8_avx2<false>(even), _mm256_loadu_ps(x + g * kGroup)));
      const __m256 d = _mm256_fmadd_ps(quants8_avx2<false>(_mm_srli_si128(odd, 8)), _mm256_loadu_ps(x + (g + 1) * kGroup + 8),
                                       _mm256_mul_ps(quants8_avx2<false>(odd), _mm256_loadu_ps(x + (g + 1) * kGroup)));
      if (g % 4 == 0) {
        acc0 = _mm256_fmadd_ps(e, _mm256_set1_ps(a[g]), acc0);
        acc1 = _mm256_fmadd_ps(d, _mm256_set1_ps(a[g + 1]), acc1);
      } else {
        acc2 = _mm256_fmadd_ps(e, _mm256_set1_ps(a[g]), acc2);
        acc3 = _mm256_fmadd_ps(d, _mm256_set1_ps(a[g + 1]), acc3);
      }
    }
    offsets = _mm256_fmadd_ps(_mm256_load_ps(b), _mm256_loadu_ps(sums), offsets);
    offsets = _mm256_fmadd_ps(_mm256_load_ps(b + 8), _mm256_loadu_ps(sums + 8), offsets);
  }
  return sum4_avx2(acc0, acc1, acc2, _mm256_add_ps(acc3, offsets));
}

// The K-quants on 16 lanes: per group of 16, a (q . x) on one chain of two, and b (the group's sum
// of x) for all 16 groups of a block in one multiply-add.
template <QuantFormat F>
TP_AVX512 float fused_dot_avx512(const Problem& p, int64_t o, const float* __restrict x) {
  if constexpr (block_is_32<F>()) return fused_dot32_avx512<F>(p, o, x);
  alignas(64) uint8_t q[256];
  alignas(64) float a[16], b[16];
  const uint8_t* row = p.w + o * p.row_bytes;
  const float* sums = p.x_sums;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), offsets = _mm512_setzero_ps();
  for (int64_t k = 0; k < p.blocks; ++k, x += p.weights, sums += 16) {
    scales<F>(row + k * p.bytes, a, b);
    bytes_avx2<F>(row + k * p.bytes, q);
    for (int g = 0; g < 16; g += 2) {
      const __m128i even = _mm_load_si128(reinterpret_cast<const __m128i*>(q + g * kGroup));
      const __m128i odd = _mm_load_si128(reinterpret_cast<const __m128i*>(q + (g + 1) * kGroup));
      const __m512 t0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(even)), _mm512_loadu_ps(x + g * kGroup));
      const __m512 t1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(odd)), _mm512_loadu_ps(x + (g + 1) * kGroup));
      acc0 = _mm512_fmadd_ps(t0, _mm512_set1_ps(a[g]), acc0);
      acc1 = _mm512_fmadd_ps(t1, _mm512_set1_ps(a[g + 1]), acc1);
    }
    offsets = _mm512_fmadd_ps(_mm512_load_ps(b), _mm512_loadu_ps(sums), offsets);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), offsets));
}

// -- dot products of a dequantized row with a token ----------------------------------------------------

float dot_scalar(const float* w, const float* x, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += w[i] * x[i];
  return acc;
}

TP_AVX2 float dot_avx2(const float* w, const float* x, int64_t n) {  // n a multiple of 16
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
  }
  const __m256 acc = _mm256_add_ps(acc0, acc1);
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

TP_AVX512 float dot_avx512(const float* w, const float* x, int64_t n) {  // n a multiple of 16
  __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};  // two chains of multiply-adds in flight
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), acc[0]);
    acc[1] = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), acc[1]);
  }
  if (i < n) acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), acc[0]);
  return _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
}

// -- rows ----------------------------------------------------------------------------------------------------

using DequantizeFn = void (*)(const Problem&, int64_t, Scratch&, float*);
using DotFn = float (*)(const float*, const float*, int64_t);
using FusedDotFn = float (*)(const Problem&, int64_t, const float*);

struct Kernels {
  DequantizeFn dequantize;
  DotFn dot;
  FusedDotFn fused;  ///< one token, or nullptr
};

// From this many tokens on, tiles of kTileRows rows are dequantized and multiplied by at::mm.
constexpr int64_t kMatmulTokens = 16;
constexpr int64_t kTileRows = 64;

// Output rows [begin, end) for a few tokens: each row dequantized once (in cache), then dotted with
// every token.
void rows(const Problem& p, const Kernels& k, int64_t begin, int64_t end) {
  if (p.tokens == 1 && k.fused != nullptr) {
    for (int64_t o = begin; o < end; ++o) p.y[o] = k.fused(p, o, p.x) + (p.bias != nullptr ? p.bias[o] : 0.0f);
    return;
  }
  Scratch scratch(p);
  std::vector<float> w(p.in);
  for (int64_t o = begin; o < end; ++o) {
    k.dequantize(p, o, scratch, w.data());
    for (int64_t t = 0; t < p.tokens; ++t) {
      const float v = k.dot(w.data(), p.x + t * p.in, p.in);
      p.y[t * p.out_features + o] = v + (p.bias != nullptr ? p.bias[o] : 0.0f);
    }
  }
}

// Tiles [begin, end) of kTileRows rows for many tokens: y[:, tile] = x tile^T (+ bias).
void tiles(const Problem& p, const Kernels& k, int64_t begin, int64_t end) {
  Scratch scratch(p);
  at::Tensor tile = at::empty({kTileRows, p.in}, at::kFloat);
  const at::Tensor x = at::from_blob(const_cast<float*>(p.x), {p.tokens, p.in}, at::kFloat);
  const at::Tensor y = at::from_blob(p.y, {p.tokens, p.out_features}, at::kFloat);
  for (int64_t i = begin; i < end; ++i) {
    const int64_t first = i * kTileRows, n = std::min(kTileRows, p.out_features - first);
    for (int64_t r = 0; r < n; ++r) k.dequantize(p, first + r, scratch, tile.data_ptr<float>() + r * p.in);
    at::Tensor part = at::mm(x, tile.narrow(0, 0, n).t());
    if (p.bias != nullptr) part += at::from_blob(const_cast<float*>(p.bias) + first, {n}, at::kFloat);
    y.narrow(1, first, n).copy_(part);
  }
}

template <QuantFormat F>
Kernels kernels_for(QuantKernel kernel) {
  if (kernel == QuantKernel::kAvx512) return {dequantize_row_avx2<F>, dot_avx512, fused_dot_avx512<F>};
  if (kernel == QuantKernel::kAvx2) return {dequantize_row_avx2<F>, dot_avx2, fused_dot_avx2<F>};
  return {dequantize_row_scalar<F>, dot_scalar, nullptr};
}

Kernels kernels_for(QuantFormat format, QuantKernel kernel) {
  switch (format) {
    case QuantFormat::kQ8_0: return kernels_for<QuantFormat::kQ8_0>(kernel);
    case QuantFormat::kQ4_0: return kernels_for<QuantFormat::kQ4_0>(kernel);
    case QuantFormat::kQ4_1: return kernels_for<QuantFormat::kQ4_1>(kernel);
    case QuantFormat::kQ5_0: return kernels_for<QuantFormat::kQ5_0>(kernel);
    case QuantFormat::kQ5_1: return kernels_for<QuantFormat::kQ5_1>(kernel);
    case QuantFormat::kQ2_K: return kernels_for<QuantFormat::kQ2_K>(kernel);
    case QuantFormat::kQ3_K: return kernels_for<QuantFormat::kQ3_K>(kernel);
    case QuantFormat::kQ4_K: return kernels_for<QuantFormat::kQ4_K>(kernel);
    case QuantFormat::kQ5_K: return kernels_for<QuantFormat::kQ5_K>(kernel);
    case QuantFormat::kQ6_K: return kernels_for<QuantFormat::kQ6_K>(kernel);
  }
  return {nullptr, nullptr, nullptr};
}

// A part of the rows gets at least this many bytes of weights per token: less costs more to hand
// to another thread than it saves.
constexpr int64_t kMinPartBytes = 64 * 1024;

}  // namespace

void linear(QuantFormat format, QuantKernel kernel, const float* x, int64_t tokens, int64_t in, const uint8_t* w,
            int64_t out_features, const float* bias, float* y, QuantLayout layout) {
  if (tokens == 0 || out_features == 0) return;
  Problem p;
  p.tokens = tokens;
  p.in = in;
  p.out_features = out_features;
  p.weights = block_weights(format);
  p.blocks = in / p.weights;
  p.bytes = block_bytes(format);
  p.row_bytes = p.blocks * p.bytes;
  p.groups = in / kGroup;
  p.format = format;
  if (layout == QuantLayout::kRows16) p.grouped_rows = out_features / block::kGroupRows * block::kGroupRows;
  p.w = w;
  p.x = x;
  p.bias = bias;
  p.y = y;
  Kernels k = kernels_for(format, kernel);
  if (p.grouped_rows > 0) k.fused = nullptr;  // reads GGUF rows in place
  if (tokens >= kMatmulTokens) {
    at::parallel_for(0, (out_features + kTileRows - 1) / kTileRows, 1,
                     [&](int64_t begin, int64_t end) { tiles(p, k, begin, end); });
    return;
  }
  std::vector<float> x_sums;
  if (tokens == 1 && k.fused != nullptr) {  // sums per 32 weights (32-weight formats) or group of 16 (K-quants)
    const int64_t span = p.weights == 32 ? 32 : kGroup;
    x_sums.resize(in / span);
    for (size_t i = 0; i < x_sums.size(); ++i) {
      float sum = 0.0f;
      for (int64_t j = 0; j < span; ++j) sum += x[static_cast<int64_t>(i) * span + j];
      x_sums[i] = sum;
    }
    p.x_sums = x_sums.data();
  }
  const int64_t grain = std::max<int64_t>(1, kMinPartBytes / (p.row_bytes * tokens));
  const auto body = [&](int64_t begin, int64_t end) { rows(p, k, begin, end); };
  // One token on the decode team (base/parallel.h), more on LibTorch's threads.
  if (tokens == 1) {
    base::parallel_for(0, out_features, grain, body);
  } else {
    at::parallel_for(0, out_features, grain, body);
  }
}

}  // namespace torchpatch::nn::ggml
