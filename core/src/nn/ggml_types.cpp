// GGML's block types and their dequantization. Each block stores its weights as small integers and
// one or two fp16 scales (the K-quants: 256 weights in 16 or 8 groups, each group with a 6-bit or
// 8-bit scale of its own). The arithmetic is the `gguf` package's, step for step (float32, scale
// products first, no fused multiply-add: this file is compiled with -ffp-contract=off), so the
// values are its values bit for bit.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>

#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <fmt/format.h>

#include "torchpatch/nn/ggml_types.h"
#include "torchpatch/error.h"

namespace torchpatch::nn {

namespace {

constexpr int64_t QK = 32;    // weights per block of the 32-formats
constexpr int64_t QK_K = 256; // weights per K-quant super-block

constexpr GgmlTypeInfo kTypes[] = {
    {GgmlType::F32, "F32", 1, 4, true},       {GgmlType::F16, "F16", 1, 2, true},
    {GgmlType::BF16, "BF16", 1, 2, true},     {GgmlType::F64, "F64", 1, 8, true},
    {GgmlType::Q4_0, "Q4_0", QK, 18, true},   {GgmlType::Q4_1, "Q4_1", QK, 20, true},
    {GgmlType::Q5_0, "Q5_0", QK, 22, true},   {GgmlType::Q5_1, "Q5_1", QK, 24, true},
    {GgmlType::Q8_0, "Q8_0", QK, 34, true},   {GgmlType::Q8_1, "Q8_1", QK, 36, true},
    {GgmlType::Q2_K, "Q2_K", QK_K, 84, true}, {GgmlType::Q3_K, "Q3_K", QK_K, 110, true},
    {GgmlType::Q4_K, "Q4_K", QK_K, 144, true}, {GgmlType::Q5_K, "Q5_K", QK_K, 176, true},
    {GgmlType::Q6_K, "Q6_K", QK_K, 210, true}, {GgmlType::Q8_K, "Q8_K", QK_K, 292, true},
    {GgmlType::I8, "I8", 1, 1, false},        {GgmlType::I16, "I16", 1, 2, false},
    {GgmlType::I32, "I32", 1, 4, false},      {GgmlType::I64, "I64", 1, 8, false},
};

float half(const uint8_t* p) { return c10::detail::fp16_ieee_to_fp32_value(static_cast<uint16_t>(p[0] | p[1] << 8)); }

float bfloat(const uint8_t* p) {
  const uint32_t bits = static_cast<uint32_t>(p[0] | p[1] << 8) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// -- the 32-weight formats: [d][m?][qh?][quants] ---------------------------------------------------

void q4_0(const uint8_t* b, float* y) {  // [d][16: q[j] | q[j+16] << 4], y = d * (q - 8)
  const float d = half(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((b[2 + j] & 0xF) - 8);
    y[j + 16] = d * static_cast<float>((b[2 + j] >> 4) - 8);
  }
}

void q4_1(const uint8_t* b, float* y) {  // [d][m][16 nibbles], y = d * q + m
  const float d = half(b), m = half(b + 2);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(b[4 + j] & 0xF) + m;
    y[j + 16] = d * static_cast<float>(b[4 + j] >> 4) + m;
  }
}

uint32_t high_bits(const uint8_t* p) {
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  return qh;
}

void q5_0(const uint8_t* b, float* y) {  // [d][qh: bit j = q[j]'s fifth][16 nibbles], y = d * (q - 16)
  const float d = half(b);
  const uint32_t qh = high_bits(b + 2);
  for (int j = 0; j < 16; ++j) {
    const int lo = (b[6 + j] & 0xF) | ((qh >> j) & 1) << 4;
    const int hi = (b[6 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

void q5_1(const uint8_t* b, float* y) {  // [d][m][qh][16 nibbles], y = d * q + m
  const float d = half(b), m = half(b + 2);
  const uint32_t qh = high_bits(b + 4);
  for (int j = 0; j < 16; ++j) {
    const int lo = (b[8 + j] & 0xF) | ((qh >> j) & 1) << 4;
    const int hi = (b[8 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

void q8(const uint8_t* b, int scale_bytes, float* y) {  // Q8_0 [d][32 int8], Q8_1 [d][s][32 int8]
  const float d = half(b);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(static_cast<int8_t>(b[scale_bytes + j]));
}

// -- the K-quants: 256 weights -------------------------------------------------------------------

// Q2_K [16 scales: d-nibble | m-nibble << 4][64 bytes: 4 two-bit quants each][d][dmin].
// Weight v = 128 h + 32 s + l comes from bits 2s of byte 32 h + l, in group v / 16.
void q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = half(b + 80), dmin = half(b + 82);
  for (int v = 0; v < QK_K; ++v) {
    const int h = v / 128, s = (v % 128) / 32, l = v % 32, g = v / 16;
    const float dl = d * static_cast<float>(scales[g] & 0xF), ml = dmin * static_cast<float>(scales[g] >> 4);
    y[v] = dl * static_cast<float>((qs[32 * h + l] >> (2 * s)) & 3) - ml;
  }
}

// Q3_K [32 bytes hmask][64 bytes: two-bit quants as Q2_K][12 bytes: 16 six-bit scales][d].
// Scale g: low nibble from byte g % 8 (high half for g >= 8), top two bits from byte 8 + g % 4 at 2 (g / 4);
// minus 32. The weight's third bit, bit v / 32 of hmask[v % 32], clear means minus 4.
void q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = half(b + 108);
  float dl[16];
  for (int g = 0; g < 16; ++g) {
    const int low = (sc[g % 8] >> (g < 8 ? 0 : 4)) & 0xF;
    const int high = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
    dl[g] = d * static_cast<float>(static_cast<int8_t>(low | high << 4) - 32);
  }
  for (int v = 0; v < QK_K; ++v) {
    const int h = v / 128, s = (v % 128) / 32, l = v % 32;
    const int q = ((qs[32 * h + l] >> (2 * s)) & 3) - (((hmask[l] >> (v / 32)) & 1) ? 0 : 4);
    y[v] = dl[v / 16] * static_cast<float>(q);
  }
}

// The eight six-bit scales and mins of Q4_K and Q5_K, packed in 12 bytes.
void scale_min_k4(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q4_K [d][dmin][12 bytes scales][128 bytes]. Weight v = 64 c + 32 n + l is nibble n of byte 32 c + l,
// in group v / 32: y = (d * sc) * q - (dmin * m). Q5_K adds [32 bytes qh] before the nibbles: the
// fifth bit is bit v / 32 of qh[l].
void q45_k(const uint8_t* b, bool five, float* y) {
  const float d = half(b), dmin = half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = five ? b + 48 : b + 16;
  for (int g = 0; g < 8; ++g) {
    int sc = 0, m = 0;
    scale_min_k4(scales, g, sc, m);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      const int v = 32 * g + l, c = g / 2, n = g % 2;
      int q = (qs[32 * c + l] >> (4 * n)) & 0xF;
      if (five) q |= ((qh[l] >> (v / 32)) & 1) << 4;
      y[v] = dl * static_cast<float>(q) - ml;
    }
  }
}

// Q6_K [128 bytes low nibbles][64 bytes high pairs][16 int8 scales][d]. Weight v = 128 h + r: low
// nibble r / 64 of ql[64 h + r % 64], high bits 2 (r / 32) of qh[32 h + r % 32]; minus 32; group v / 16.
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half(b + 208);
  for (int v = 0; v < QK_K; ++v) {
    const int h = v / 128, r = v % 128;
    const int low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
    const int high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
    const float dl = d * static_cast<float>(sc[v / 16]);
    y[v] = dl * static_cast<float>(static_cast<int8_t>(low | high << 4) - 32);
  }
}

void q8_k(const uint8_t* b, float* y) {  // [d: float32][256 int8][16 int16 sums]
  float d;
  std::memcpy(&d, b, 4);
  for (int v = 0; v < QK_K; ++v) y[v] = d * static_cast<float>(static_cast<int8_t>(b[4 + v]));
}

void block(GgmlType type, const uint8_t* b, float* y) {
  switch (type) {
    case GgmlType::F32: std::memcpy(y, b, 4); break;
    case GgmlType::F16: *y = half(b); break;
    case GgmlType::BF16: *y = bfloat(b); break;
    case GgmlType::F64: {
      double v;
      std::memcpy(&v, b, 8);
      *y = static_cast<float>(v);
      break;
    }
    case GgmlType::Q4_0: q4_0(b, y); break;
    case GgmlType::Q4_1: q4_1(b, y); break;
    case GgmlType::Q5_0: q5_0(b, y); break;
    case GgmlType::Q5_1: q5_1(b, y); break;
    case GgmlType::Q8_0: q8(b, 2, y); break;
    case GgmlType::Q8_1: q8(b, 4, y); break;
    case GgmlType::Q2_K: q2_k(b, y); break;
    case GgmlType::Q3_K: q3_k(b, y); break;
    case GgmlType::Q4_K: q45_k(b, false, y); break;
    case GgmlType::Q5_K: q45_k(b, true, y); break;
    case GgmlType::Q6_K: q6_k(b, y); break;
    case GgmlType::Q8_K: q8_k(b, y); break;
    default: break;
  }
}

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t id) {
  for (const auto& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == id) return &t;
  }
  return nullptr;
}

const GgmlTypeInfo& ggml_type_info(GgmlType type) {
  const auto* info = ggml_type_info(static_cast<uint32_t>(type));
  if (info == nullptr) throw InputError(fmt::format("GGML type {} is not one torchpatch knows", static_cast<uint32_t>(type)));
  return *info;
}

const GgmlTypeInfo* ggml_type_named(const std::string& name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  for (const auto& t : kTypes) {
    if (upper == t.name) return &t;
  }
  return nullptr;
}

void dequantize_ggml(GgmlType type, const uint8_t* blocks, int64_t count, float* out) {
  const auto& info = ggml_type_info(type);
  if (!info.floating) throw InputError(fmt::format("{} holds integers, not weights to dequantize", info.name));
  if (count % info.block_size != 0) {
    throw InputError(fmt::format("{} values are not whole blocks of {} ({})", count, info.block_size, info.name));
  }
  const int64_t n_blocks = count / info.block_size;
  at::parallel_for(0, n_blocks, 4096 / info.block_size + 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) block(type, blocks + i * info.type_size, out + i * info.block_size);
  });
}

}  // namespace torchpatch::nn
