// The kRows16 layout of quantized weights (nn/quant.h): GGUF rows rearranged so that the AVX-512
// decoding kernel reads one stream and feeds 16 rows with every 64-byte load.
#include "torchpatch/nn/quant.h"

#include <algorithm>
#include <cstring>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include "torchpatch/error.h"
#include "base/huge_pages.h"
#include "nn/quant_block.h"

namespace torchpatch::nn {

namespace block {

namespace {

constexpr uint32_t kQ8Flip = 0x80808080u;  // int8 w -> unsigned w + 128, and back

/// One group of 16 GGUF rows (`rows`) into kRows16 (`group`).
void pack_group(bool q8, const uint8_t* rows, int64_t blocks, uint8_t* group) {
  const int64_t bytes = q8 ? kQ8_0Bytes : kQ4_0Bytes, row_bytes = blocks * bytes;
  for (int64_t b = 0; b < blocks; ++b) {
    const Rows16Block at = rows16_block(b, blocks, bytes);
    for (int64_t r = 0; r < kGroupRows; ++r) {
      const uint8_t* in = rows + r * row_bytes + b * bytes;
      std::memcpy(group + at.scales + 2 * r, in, kScaleBytes);
      for (int64_t k = 0; k < (bytes - kScaleBytes) / 4; ++k) {
        uint32_t word = 0;
        std::memcpy(&word, in + kScaleBytes + 4 * k, 4);
        if (q8) word ^= kQ8Flip;
        std::memcpy(group + at.quants + 64 * k + 4 * r, &word, 4);
      }
    }
  }
}

// uint8 [..., rows, whole blocks], contiguous, or an error naming `name`.
void check_blocks(QuantFormat format, const at::Tensor& t, const std::string& name) {
  if (t.scalar_type() != at::kByte || t.dim() < 2 || t.size(-1) % block_bytes(format) != 0) {
    throw InputError(fmt::format("tensor '{}': {} blocks to lay out are uint8 matrices of whole {}-byte blocks, not {} {}",
                                 name, format_name(format), block_bytes(format), c10::toString(t.scalar_type()),
                                 fmt::join(t.sizes(), "x")));
  }
}

/// Rows [row, row + nrows) of a kRows16 matrix of `rows` rows as GGUF rows, into `dst`.
void unpack_rows16(QuantFormat format, const uint8_t* matrix, int64_t rows, int64_t blocks, int64_t row,
                   int64_t nrows, uint8_t* dst) {
  const bool q8 = format == QuantFormat::kQ8_0;
  const int64_t bytes = bytes_of(format), row_bytes = blocks * bytes, full = rows / kGroupRows * kGroupRows;
  for (int64_t r = row; r < row + nrows; ++r, dst += row_bytes) {
    if (r >= full) {
      std::memcpy(dst, matrix + r * row_bytes, row_bytes);
      continue;
    }
    const uint8_t* group = matrix + (r / kGroupRows) * kGroupRows * row_bytes;
    const int64_t lane = r % kGroupRows;
    for (int64_t b = 0; b < blocks; ++b) {
      const Rows16Block at = rows16_block(b, blocks, bytes);
      uint8_t* out = dst + b * bytes;
      std::memcpy(out, group + at.scales + 2 * lane, kScaleBytes);
      for (int64_t k = 0; k < (bytes - kScaleBytes) / 4; ++k) {
        uint32_t word = 0;
        std::memcpy(&word, group + at.quants + 64 * k + 4 * lane, 4);
        if (q8) word ^= kQ8Flip;
        std::memcpy(out + kScaleBytes + 4 * k, &word, 4);
      }
    }
  }
}

// Every matrix converted group by group across the intra-op threads (the tail rows as they are).
at::Tensor convert(QuantFormat format, bool pack, const at::Tensor& from, const std::string& name) {
  check_blocks(format, from, name);
  const at::Tensor src = from.contiguous();
  // Packed weights are written once at load: in huge pages, packing llama-125m's 205 MB of Q8_0 took
  // 0.12-0.16 s here, against 0.6 s faulting in 4 KiB pages (as long as a clone of the same bytes).
  at::Tensor dst = pack ? base::empty_in_huge_pages(src.sizes(), at::kByte) : at::empty(src.sizes(), at::kByte);
  const int64_t rows = src.size(-2), row_bytes = src.size(-1), blocks = row_bytes / block_bytes(format);
  const int64_t matrices = rows * row_bytes == 0 ? 0 : src.numel() / (rows * row_bytes);
  const int64_t groups = (rows + kGroupRows - 1) / kGroupRows;  // the last one may be a tail
  const uint8_t* in = src.data_ptr<uint8_t>();
  uint8_t* out = dst.data_ptr<uint8_t>();
  at::parallel_for(0, matrices * groups, 8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t matrix = (i / groups) * rows * row_bytes, row = (i % groups) * kGroupRows;
      const int64_t n = std::min(kGroupRows, rows - row), offset = matrix + row * row_bytes;
      if (!pack) {
        unpack_rows16(format, in + matrix, rows, blocks, row, n, out + offset);
      } else if (n == kGroupRows) {
        pack_group(format == QuantFormat::kQ8_0, in + offset, blocks, out + offset);
      } else {
        std::memcpy(out + offset, in + offset, n * row_bytes);
      }
    }
  });
  return dst;
}

}  // namespace


}  // namespace block

QuantLayout preferred_quant_layout() {
  return quant_kernel_available(QuantKernel::kAvx512) ? QuantLayout::kRows16 : QuantLayout::kBlocks;
}

at::Tensor pack_blocks(QuantFormat format, const at::Tensor& blocks, const std::string& name) {
  return block::convert(format, /*pack=*/true, blocks, name);
}

at::Tensor unpack_blocks(QuantFormat format, const at::Tensor& packed, const std::string& name) {
  return block::convert(format, /*pack=*/false, packed, name);
}

}  // namespace torchpatch::nn
