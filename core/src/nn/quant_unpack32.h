// Internal: the quants of one block of a 32-weight GGUF format (nn/quant_block.h) as unsigned bytes in
// weight order, Q8_0's int8 as q + 128: in plain C++ and with AVX2's byte operations (32 at once).
// Shared by the float-activation kernels (quant_ggml_kernels.cpp) and the 8-bit ones (quant_kernels.cpp).
// Include from kernel .cpp files only (base/x86_intrinsics.h).
#pragma once

#include <cstdint>
#include <cstring>

#include "base/x86_intrinsics.h"
#include "nn/quant_block.h"

namespace torchpatch::nn::block {

inline uint32_t load_word(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

template <QuantFormat F>
inline void unpack32(const uint8_t* __restrict blk, uint8_t* __restrict q) {
  constexpr Layout32 L = layout32(F);
  static_assert(L.bytes > 0, "a format of 32 weights a block");
  const uint8_t* qs = blk + L.quants;
  if constexpr (F == QuantFormat::kQ8_0) {
    for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(qs[j] ^ 0x80);
  } else {
    const uint32_t qh = L.fifth >= 0 ? load_word(blk + L.fifth) : 0;
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<uint8_t>((qs[j] & 0xF) | ((qh >> j) & 1) << 4);
      q[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
    }
  }
}

#if defined(__x86_64__)

/// Byte j of 32 = `value` where bit j of `bits` is set, else 0.
__attribute__((target("avx2"))) inline __m256i bit_bytes_avx2(uint32_t bits, int value) {
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                                             _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                                              2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(static_cast<char>(value)));
}

/// unpack32 in a register.
template <QuantFormat F>
__attribute__((target("avx2"), always_inline)) inline __m256i quants32_avx2(const uint8_t* blk) {
  constexpr Layout32 L = layout32(F);
  if constexpr (F == QuantFormat::kQ8_0) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + L.quants));
    return _mm256_xor_si256(q, _mm256_set1_epi8(static_cast<char>(0x80)));
  } else {
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + L.quants));
    const __m256i nibbles = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), _mm256_set1_epi8(0xF));
    if constexpr (L.fifth < 0) return nibbles;
    return _mm256_or_si256(nibbles, bit_bytes_avx2(load_word(blk + L.fifth), 16));
  }
}

#endif

}  // namespace torchpatch::nn::block
