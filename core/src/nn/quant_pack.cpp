// The kRows16 layout of quantized weights (nn/quant.h): GGUF rows rearranged so that the vector
// kernels read one stream and feed 16 rows with every 64-byte load (AVX2: 8 with each half).
#include "torchpatch/nn/quant.h"

#include <algorithm>
#include <cstring>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/error.h"
#include "base/huge_pages.h"
#include "nn/quant_block.h"

namespace torchpatch::nn {

namespace block {

namespace {

/// One group of 16 rows between GGUF rows (`rows`) and kRows16 (`group`): into `group` when packing,
/// out of it otherwise. Both hold the same 16 * blocks * bytes bytes.
void convert_group(bool q8, bool pack, const uint8_t* from, int64_t blocks, uint8_t* to) {
  const int64_t bytes = q8 ? kQ8_0Bytes : kQ4_0Bytes, row_bytes = blocks * bytes;
  for (int64_t b = 0; b < blocks; ++b) {
    const Rows16Block at = rows16_block(b, blocks, bytes);
    for (int64_t r = 0; r < kGroupRows; ++r) {
      const int64_t row_at = r * row_bytes + b * bytes;     // the block in GGUF rows
      const int64_t scale_at = at.scales + 2 * r;           // its scale in the group
      std::memcpy(to + (pack ? scale_at : row_at), from + (pack ? row_at : scale_at), kScaleBytes);
      for (int64_t k = 0; k < (bytes - kScaleBytes) / 4; ++k) {
        const int64_t word_in_row = row_at + kScaleBytes + 4 * k, word_in_group = at.quants + 64 * k + 4 * r;
        uint32_t word = 0;
        std::memcpy(&word, from + (pack ? word_in_row : word_in_group), 4);
        std::memcpy(to + (pack ? word_in_group : word_in_row), &word, 4);
      }
    }
  }
}

// uint8 [..., rows, whole blocks], contiguous, or an error naming `name`.
void check_blocks(QuantFormat format, const at::Tensor& t, const std::string& name) {
  if (!quantizes_to(format)) {
    throw InputError(fmt::format("tensor '{}': only q8_0 and q4_0 blocks are laid out as kRows16, not {}", name,
                                 format_name(format)));
  }
  if (t.scalar_type() != at::kByte || t.dim() < 2 || t.size(-1) % block_bytes(format) != 0) {
    throw InputError(fmt::format("tensor '{}': {} blocks to lay out are uint8 matrices of whole {}-byte blocks, not {} {}",
                                 name, format_name(format), block_bytes(format), c10::toString(t.scalar_type()),
                                 fmt::join(t.sizes(), "x")));
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
      if (n == kGroupRows) {
        convert_group(format == QuantFormat::kQ8_0, pack, in + offset, blocks, out + offset);
      } else {
        std::memcpy(out + offset, in + offset, n * row_bytes);
      }
    }
  });
  return dst;
}

}  // namespace


}  // namespace block

namespace {
thread_local int gguf_blocks_only = 0;
}  // namespace

GgufBlocksOnly::GgufBlocksOnly() { ++gguf_blocks_only; }
GgufBlocksOnly::~GgufBlocksOnly() { --gguf_blocks_only; }

QuantLayout preferred_quant_layout() {
  if (gguf_blocks_only > 0) return QuantLayout::kBlocks;
  // kRows16 is what the AVX-512 and AVX2 kernels read fastest; the scalar one would unpack it for
  // every product.
  return active_quant_kernel() == QuantKernel::kScalar ? QuantLayout::kBlocks : QuantLayout::kRows16;
}

QuantLayout preferred_quant_layout(QuantFormat format) {
  return quantizes_to(format) ? preferred_quant_layout() : QuantLayout::kBlocks;
}

at::Tensor pack_blocks(QuantFormat format, const at::Tensor& blocks, const std::string& name) {
  return block::convert(format, /*pack=*/true, blocks, name);
}

at::Tensor unpack_blocks(QuantFormat format, const at::Tensor& packed, const std::string& name) {
  return block::convert(format, /*pack=*/false, packed, name);
}

}  // namespace torchpatch::nn
