// Internal: the byte layout of GGUF's Q8_0 and Q4_0 blocks (nn/quant.h), shared by the reference
// quantizer (quant_formats.cpp) and the product kernels (quant_kernels.cpp, quant_ggml_kernels.cpp),
// and of the other formats of 32 weights a block.
//
//   Q8_0  [d: fp16, little-endian][32 x int8]                       34 bytes
//   Q4_0  [d: fp16, little-endian][16 bytes: q[j] | q[j + 16] << 4]  18 bytes
//
// and the kRows16 layout's offsets (nn/quant.h), shared by pack/unpack (quant_pack.cpp) and the kernels.
#pragma once

#include <cstdint>

#include <c10/util/Half.h>

#include "torchpatch/nn/quant.h"

namespace torchpatch::nn::block {

constexpr int64_t kScaleBytes = 2;                                        ///< the fp16 scale first
constexpr int64_t kQ8_0Bytes = kScaleBytes + kQuantBlockSize;             ///< 34
constexpr int64_t kQ4_0Bytes = kScaleBytes + kQuantBlockSize / 2;         ///< 18

/// Q8_0's or Q4_0's block bytes (the formats with kernels and layouts of their own).
constexpr int64_t bytes_of(QuantFormat format) { return format == QuantFormat::kQ8_0 ? kQ8_0Bytes : kQ4_0Bytes; }

/// The fp16 scale at `p` (a block's first two bytes), as float32.
inline float load_half(const uint8_t* p) {
  return c10::detail::fp16_ieee_to_fp32_value(static_cast<uint16_t>(p[0] | p[1] << 8));
}

/// Writes `value` rounded to fp16 (nearest even, as numpy's astype(float16)) at `p`, little-endian.
inline void store_half(uint8_t* p, float value) {
  const uint16_t bits = c10::Half(value).x;
  p[0] = static_cast<uint8_t>(bits & 0xff);
  p[1] = static_cast<uint8_t>(bits >> 8);
}

/// GGUF's formats of 32 weights per block, each weight w = d q + b with q unsigned:
///
///   Q8_0  [d][32 int8]                          q = the int8 + 128, b = -128 d
///   Q4_0  [d][16: q[j] | q[j + 16] << 4]         b = -8 d
///   Q4_1  [d][m][16 as Q4_0]                     b = m
///   Q5_0  [d][qh: fifth bit j of weight j][16]   b = -16 d
///   Q5_1  [d][m][qh][16]                         b = m
struct Layout32 {
  int64_t bytes;      ///< per block
  int64_t quants;     ///< where the nibbles (Q8_0: the int8 values) start
  int64_t fifth;      ///< where the 32-bit word of fifth bits is, or -1
  bool stored_b;      ///< b is the fp16 at byte 2 (Q4_1, Q5_1)
  int32_t offset;     ///< otherwise b = -offset * d
};

constexpr bool is_block32(QuantFormat format) {
  return format == QuantFormat::kQ8_0 || format == QuantFormat::kQ4_0 || format == QuantFormat::kQ4_1 ||
         format == QuantFormat::kQ5_0 || format == QuantFormat::kQ5_1;
}

/// The layout of a format for which is_block32() holds.
constexpr Layout32 layout32(QuantFormat format) {
  switch (format) {
    case QuantFormat::kQ8_0: return {kQ8_0Bytes, 2, -1, false, 128};
    case QuantFormat::kQ4_0: return {kQ4_0Bytes, 2, -1, false, 8};
    case QuantFormat::kQ4_1: return {20, 4, -1, true, 0};
    case QuantFormat::kQ5_0: return {22, 6, 2, false, 16};
    case QuantFormat::kQ5_1: return {24, 8, 4, true, 0};
    default: return {0, 0, -1, false, 0};
  }
}

constexpr int64_t kGroupRows = 16;  ///< rows per kRows16 group

/// The formats laid out as kRows16 (nn/quant.h): every format of 32 weights a block.
constexpr bool has_rows16(QuantFormat format) { return is_block32(format); }

/// Bytes of a block ahead of its quants, its header: fp16 d (and Q4_1's and Q5_1's m), then Q5_0's
/// and Q5_1's 32 fifth bits.
constexpr int64_t header_bytes(QuantFormat format) { return layout32(format).quants; }

/// Where block `b` of a kRows16 group (`blocks` per row, `bytes` each, the first `header` of them its
/// header) lies, from the group's start: its header (a field at byte s of a block, n bytes long, holds
/// row i's value at scales + 16 s + n i) and its quants (16 rows x 4 bytes per 64-byte register).
struct Rows16Block {
  int64_t scales;
  int64_t quants;
};

inline Rows16Block rows16_block(int64_t b, int64_t blocks, int64_t bytes, int64_t header = kScaleBytes) {
  const int64_t pair = (b / 2) * 2 * kGroupRows * bytes;
  const int64_t head = kGroupRows * header, quant_bytes = kGroupRows * (bytes - header);
  if ((b | 1) < blocks) return {pair + (b % 2) * head, pair + 2 * head + (b % 2) * quant_bytes};  // a whole pair
  return {pair, pair + head};                                                                    // an odd last block
}

/// Row `r` of a kRows16 group of `format` blocks copied out as its GGUF row (`blocks` blocks) into `row`.
void copy_row_from_group(QuantFormat format, const uint8_t* group, int64_t r, int64_t blocks, uint8_t* row);

}  // namespace torchpatch::nn::block
