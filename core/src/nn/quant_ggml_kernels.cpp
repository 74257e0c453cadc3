// Products with Q4_1, Q5_0, Q5_1 and the K-quants Q2_K .. Q6_K (nn/quant_ggml.h): each weight row
// unpacked once into bytes q (natural order) and a, b per 16 weights, dequantized to float in cache,
// then dotted with every token's float activations. A few tokens (decoding) go row by row; a prompt's
// many tokens take tiles of rows dequantized once and multiplied by LibTorch's matrix product.
//
// The unpacking and dequantizing are written as plain loops over bytes, inlined into each
// instruction set's kernel and compiled with -O3 (core/CMakeLists.txt), so the compiler vectorizes
// them for that set; the dot products are written out per set.
#include "nn/quant_ggml.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include "base/parallel.h"
#include "base/x86_intrinsics.h"

namespace torchpatch::nn::ggml {

namespace {

constexpr int64_t kGroup = 16;  // weights sharing one a and one b

#define TP_ALWAYS_INLINE inline __attribute__((always_inline))
#define TP_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TP_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

float half(const uint8_t* p) { return c10::detail::fp16_ieee_to_fp32_value(static_cast<uint16_t>(p[0] | p[1] << 8)); }

uint32_t word(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// -- unpacking one block: q [block weights], a and b [block weights / 16] ------------------------------------

// Q4_1 [d][m][16: q[j] | q[j+16] << 4]: w = d q + m. Q5_0 / Q5_1 add a fifth bit, bit j of a 32-bit
// word (Q5_0: [d][qh][16], w = d (q - 16); Q5_1: [d][m][qh][16], w = d q + m).
template <QuantFormat F>
TP_ALWAYS_INLINE void unpack_block32(const uint8_t* blk, uint8_t* q, float* a, float* b) {
  constexpr bool five = F != QuantFormat::kQ4_1, offset = F == QuantFormat::kQ5_0;
  const float d = half(blk);
  const float m = offset ? -16.0f * d : half(blk + 2);
  const uint8_t* qs = blk + (F == QuantFormat::kQ4_1 ? 4 : F == QuantFormat::kQ5_0 ? 6 : 8);
  const uint32_t qh = five ? word(blk + (offset ? 2 : 4)) : 0;
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<uint8_t>((qs[j] & 0xF) | (five ? ((qh >> j) & 1) << 4 : 0));
    q[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (five ? ((qh >> (j + 16)) & 1) << 4 : 0));
  }
  a[0] = a[1] = d;
  b[0] = b[1] = m;
}

// Q2_K [16 scales: d-nibble | m-nibble << 4][64: 2-bit quants][d][dmin]: weight 128 h + 32 s + l is
// bits 2s of byte 32 h + l; w = d sc q - dmin m per 16.
TP_ALWAYS_INLINE void unpack_q2_k(const uint8_t* blk, uint8_t* q, float* a, float* b) {
  const uint8_t* qs = blk + 16;
  const float d = half(blk + 80), dmin = half(blk + 82);
  for (int h = 0; h < 2; ++h) {
    for (int s = 0; s < 4; ++s) {
      for (int l = 0; l < 32; ++l) q[128 * h + 32 * s + l] = (qs[32 * h + l] >> (2 * s)) & 3;
    }
  }
  for (int g = 0; g < 16; ++g) {
    a[g] = d * static_cast<float>(blk[g] & 0xF);
    b[g] = -(dmin * static_cast<float>(blk[g] >> 4));
  }
}

// Q3_K [32 hmask][64: 2-bit quants as Q2_K][12: 16 six-bit scales][d]: the third bit is bit v / 32
// of hmask[v % 32]; w = d (scale - 32) (q - 4), q = the two bits plus 4 times the third.
TP_ALWAYS_INLINE void unpack_q3_k(const uint8_t* blk, uint8_t* q, float* a, float* b) {
  const uint8_t* hmask = blk;
  const uint8_t* qs = blk + 32;
  const uint8_t* sc = blk + 96;
  const float d = half(blk + 108);
  for (int h = 0; h < 2; ++h) {
    for (int s = 0; s < 4; ++s) {
      for (int l = 0; l < 32; ++l) {
        q[128 * h + 32 * s + l] = static_cast<uint8_t>(((qs[32 * h + l] >> (2 * s)) & 3) |
                                                       ((hmask[l] >> (4 * h + s)) & 1) << 2);
      }
    }
  }
  for (int g = 0; g < 16; ++g) {
    const int low = (sc[g % 8] >> (g < 8 ? 0 : 4)) & 0xF, high = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
    a[g] = d * static_cast<float>((low | high << 4) - 32);
    b[g] = -4.0f * a[g];
  }
}

// Q4_K [d][dmin][12: eight 6-bit scales and mins][(Q5_K: 32 qh)][128 nibbles]: weight 64 c + 32 n + l
// is nibble n of byte 32 c + l (Q5_K: fifth bit 2c + n of qh[l]); w = d sc q - dmin m per 32.
template <bool Five>
TP_ALWAYS_INLINE void unpack_q45_k(const uint8_t* blk, uint8_t* q, float* a, float* b) {
  const float d = half(blk), dmin = half(blk + 2);
  const uint8_t* s = blk + 4;
  const uint8_t* qh = blk + 16;
  const uint8_t* qs = blk + (Five ? 48 : 16);
  for (int c = 0; c < 4; ++c) {
    for (int n = 0; n < 2; ++n) {
      for (int l = 0; l < 32; ++l) {
        q[64 * c + 32 * n + l] = static_cast<uint8_t>(((qs[32 * c + l] >> (4 * n)) & 0xF) |
                                                      (Five ? ((qh[l] >> (2 * c + n)) & 1) << 4 : 0));
      }
    }
  }
  for (int j = 0; j < 8; ++j) {
    const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    a[2 * j] = a[2 * j + 1] = d * static_cast<float>(sc);
    b[2 * j] = b[2 * j + 1] = -(dmin * static_cast<float>(m));
  }
}

// Q6_K [128 low nibbles][64 high pairs][16 int8 scales][d]: weight 128 h + 32 k + l has low nibble k / 2
// of ql[64 h + 32 (k % 2) + l], high bits 2k of qh[32 h + l]; w = d sc (q - 32) per 16.
TP_ALWAYS_INLINE void unpack_q6_k(const uint8_t* blk, uint8_t* q, float* a, float* b) {
  const uint8_t* ql = blk;
  const uint8_t* qh = blk + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
  const float d = half(blk + 208);
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) {
        q[128 * h + 32 * k + l] = static_cast<uint8_t>(((ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF) |
                                                       ((qh[32 * h + l] >> (2 * k)) & 3) << 4);
      }
    }
  }
  for (int g = 0; g < 16; ++g) {
    a[g] = d * static_cast<float>(sc[g]);
    b[g] = -32.0f * a[g];
  }
}

template <QuantFormat F>
TP_ALWAYS_INLINE void unpack_block(const uint8_t* blk, uint8_t* q, float* a, float* b) {
  if constexpr (F == QuantFormat::kQ2_K) {
    unpack_q2_k(blk, q, a, b);
  } else if constexpr (F == QuantFormat::kQ3_K) {
    unpack_q3_k(blk, q, a, b);
  } else if constexpr (F == QuantFormat::kQ4_K || F == QuantFormat::kQ5_K) {
    unpack_q45_k<F == QuantFormat::kQ5_K>(blk, q, a, b);
  } else if constexpr (F == QuantFormat::kQ6_K) {
    unpack_q6_k(blk, q, a, b);
  } else {
    unpack_block32<F>(blk, q, a, b);
  }
}

// -- the problem ------------------------------------------------------------------------------------------

struct Problem {
  int64_t tokens, in, out_features;
  int64_t row_bytes, blocks, weights, bytes;  // per row: bytes, blocks; per block: weights, bytes
  int64_t groups;                             // in / 16
  const uint8_t* w;
  const float* x;  // [tokens, in]
  const float* bias;
  float* y;  // [tokens, out_features]
};

// Row `o` of W as float32 into `out` [in], through `q` [in] and `a`, `b` [in / 16]: a q + b per 16.
template <QuantFormat F>
TP_ALWAYS_INLINE void dequantize_row(const Problem& p, int64_t o, uint8_t* q, float* a, float* b, float* out) {
  const uint8_t* row = p.w + o * p.row_bytes;
  const int64_t per_block = p.weights / kGroup;
  for (int64_t k = 0; k < p.blocks; ++k) {
    unpack_block<F>(row + k * p.bytes, q + k * p.weights, a + k * per_block, b + k * per_block);
  }
  for (int64_t g = 0; g < p.groups; ++g) {
    for (int64_t j = 0; j < kGroup; ++j) out[g * kGroup + j] = a[g] * static_cast<float>(q[g * kGroup + j]) + b[g];
  }
}

// -- dot products of a dequantized row with a token ----------------------------------------------------

struct DotScalar {
  float operator()(const float* w, const float* x, int64_t n) const {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc += w[i] * x[i];
    return acc;
  }
};

struct DotAvx2 {  // n a multiple of 16
  TP_AVX2 float operator()(const float* w, const float* x, int64_t n) const {
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
};

struct DotAvx512 {  // n a multiple of 16
  TP_AVX512 float operator()(const float* w, const float* x, int64_t n) const {
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};  // two chains of multiply-adds in flight
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), acc[0]);
      acc[1] = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), acc[1]);
    }
    if (i < n) acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), acc[0]);
    return _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
  }
};

// -- rows ----------------------------------------------------------------------------------------------------

// From this many tokens on, tiles of kTileRows rows are dequantized and multiplied by at::mm.
constexpr int64_t kMatmulTokens = 16;
constexpr int64_t kTileRows = 64;

// Output rows [begin, end) for a few tokens: each row dequantized once, then dotted with every token.
// Inlined into a wrapper per instruction set, which the unpacking is compiled for.
template <QuantFormat F, class Dot>
TP_ALWAYS_INLINE void rows(const Problem& p, int64_t begin, int64_t end) {
  std::vector<uint8_t> q(p.in);
  std::vector<float> a(p.groups), b(p.groups), w(p.in);
  const Dot dot;
  for (int64_t o = begin; o < end; ++o) {
    dequantize_row<F>(p, o, q.data(), a.data(), b.data(), w.data());
    for (int64_t t = 0; t < p.tokens; ++t) {
      const float v = dot(w.data(), p.x + t * p.in, p.in);
      p.y[t * p.out_features + o] = v + (p.bias != nullptr ? p.bias[o] : 0.0f);
    }
  }
}

// Tiles [begin, end) of kTileRows rows for many tokens: y[:, tile] = x tile^T.
template <QuantFormat F>
TP_ALWAYS_INLINE void tiles(const Problem& p, int64_t begin, int64_t end) {
  std::vector<uint8_t> q(p.in);
  std::vector<float> a(p.groups), b(p.groups);
  at::Tensor tile = at::empty({kTileRows, p.in}, at::kFloat);
  const at::Tensor x = at::from_blob(const_cast<float*>(p.x), {p.tokens, p.in}, at::kFloat);
  const at::Tensor y = at::from_blob(p.y, {p.tokens, p.out_features}, at::kFloat);
  for (int64_t i = begin; i < end; ++i) {
    const int64_t first = i * kTileRows, n = std::min(kTileRows, p.out_features - first);
    for (int64_t r = 0; r < n; ++r) dequantize_row<F>(p, first + r, q.data(), a.data(), b.data(), tile.data_ptr<float>() + r * p.in);
    const at::Tensor part = at::mm(x, tile.narrow(0, 0, n).t());
    y.narrow(1, first, n).copy_(p.bias != nullptr ? part + at::from_blob(const_cast<float*>(p.bias) + first, {n}, at::kFloat) : part);
  }
}

template <QuantFormat F>
void rows_scalar(const Problem& p, int64_t begin, int64_t end) {
  rows<F, DotScalar>(p, begin, end);
}

template <QuantFormat F>
void tiles_scalar(const Problem& p, int64_t begin, int64_t end) {
  tiles<F>(p, begin, end);
}

template <QuantFormat F>
TP_AVX2 void rows_avx2(const Problem& p, int64_t begin, int64_t end) {
  rows<F, DotAvx2>(p, begin, end);
}

template <QuantFormat F>
TP_AVX2 void tiles_avx2(const Problem& p, int64_t begin, int64_t end) {
  tiles<F>(p, begin, end);
}

template <QuantFormat F>
TP_AVX512 void rows_avx512(const Problem& p, int64_t begin, int64_t end) {
  rows<F, DotAvx512>(p, begin, end);
}

template <QuantFormat F>
TP_AVX512 void tiles_avx512(const Problem& p, int64_t begin, int64_t end) {
  tiles<F>(p, begin, end);
}

using RowsFn = void (*)(const Problem&, int64_t, int64_t);

struct Kernels {
  RowsFn rows;   // output rows [begin, end), a few tokens
  RowsFn tiles;  // tiles of kTileRows rows, many tokens
};

template <QuantFormat F>
Kernels kernels_for(QuantKernel kernel) {
  if (kernel == QuantKernel::kAvx512) return {rows_avx512<F>, tiles_avx512<F>};
  if (kernel == QuantKernel::kAvx2) return {rows_avx2<F>, tiles_avx2<F>};
  return {rows_scalar<F>, tiles_scalar<F>};
}

Kernels kernels_for(QuantFormat format, QuantKernel kernel) {
  switch (format) {
    case QuantFormat::kQ4_1: return kernels_for<QuantFormat::kQ4_1>(kernel);
    case QuantFormat::kQ5_0: return kernels_for<QuantFormat::kQ5_0>(kernel);
    case QuantFormat::kQ5_1: return kernels_for<QuantFormat::kQ5_1>(kernel);
    case QuantFormat::kQ2_K: return kernels_for<QuantFormat::kQ2_K>(kernel);
    case QuantFormat::kQ3_K: return kernels_for<QuantFormat::kQ3_K>(kernel);
    case QuantFormat::kQ4_K: return kernels_for<QuantFormat::kQ4_K>(kernel);
    case QuantFormat::kQ5_K: return kernels_for<QuantFormat::kQ5_K>(kernel);
    case QuantFormat::kQ6_K: return kernels_for<QuantFormat::kQ6_K>(kernel);
    default: return {nullptr, nullptr};  // Q8_0 and Q4_0 have kernels of their own (quant_kernels.cpp)
  }
}

// A part of the rows gets at least this many bytes of weights per token: less costs more to hand
// to another thread than it saves.
constexpr int64_t kMinPartBytes = 64 * 1024;

}  // namespace

void linear(QuantFormat format, QuantKernel kernel, const float* x, int64_t tokens, int64_t in, const uint8_t* w,
            int64_t out_features, const float* bias, float* y) {
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
  p.w = w;
  p.x = x;
  p.bias = bias;
  p.y = y;
  const Kernels run = kernels_for(format, kernel);
  if (tokens >= kMatmulTokens) {
    at::parallel_for(0, (out_features + kTileRows - 1) / kTileRows, 1,
                     [&](int64_t begin, int64_t end) { run.tiles(p, begin, end); });
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kMinPartBytes / (p.row_bytes * tokens));
  const auto body = [&](int64_t begin, int64_t end) { run.rows(p, begin, end); };
  // One token on the decode team (base/parallel.h), more on LibTorch's threads.
  if (tokens == 1) {
    base::parallel_for(0, out_features, grain, body);
  } else {
    at::parallel_for(0, out_features, grain, body);
  }
}

}  // namespace torchpatch::nn::ggml
