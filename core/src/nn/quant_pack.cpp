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

/// visit(offset in the GGUF row, offset in the group, bytes) for every piece of row `r` of a kRows16 group.
template <class Visit>
void for_row_pieces(QuantFormat format, int64_t r, int64_t blocks, const Visit& visit) {
  const Layout32 layout = layout32(format);
  const int64_t bytes = layout.bytes, header = layout.quants, halves = layout.fifth >= 0 ? layout.fifth : header;
  for (int64_t b = 0; b < blocks; ++b) {
    const Rows16Block at = rows16_block(b, blocks, bytes, header);
    for (int64_t s = 0; s < halves; s += 2) visit(b * bytes + s, at.scales + 16 * s + 2 * r, 2);  // fp16 d, m
    if (layout.fifth >= 0) visit(b * bytes + layout.fifth, at.scales + 16 * layout.fifth + 4 * r, 4);
    for (int64_t k = 0; k < (bytes - header) / 4; ++k) visit(b * bytes + header + 4 * k, at.quants + 64 * k + 4 * r, 4);
  }
}

void copy_row_to_group(QuantFormat format, const uint8_t* row, int64_t r, int64_t blocks, uint8_t* group) {
  for_row_pieces(format, r, blocks, [&](int64_t in_row, int64_t in_group, int64_t n) {
    std::memcpy(group + in_group, row + in_row, n);
  });
}

// uint8 [..., rows, whole blocks], contiguous, or an error naming `name`.
void check_blocks(QuantFormat format, const at::Tensor& t, const std::string& name) {
  if (!has_rows16(format)) {
    throw InputError(fmt::format("tensor '{}': only blocks of 32 weights (q8_0, q4_0, q4_1, q5_0, q5_1) are laid out as kRows16, not {}", name,
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
        for (int64_t r = 0; r < kGroupRows; ++r) {
          if (pack) {
            copy_row_to_group(format, in + offset + r * row_bytes, r, blocks, out + offset);
          } else {
            copy_row_from_group(format, in + offset, r, blocks, out + offset + r * row_bytes);
          }
        }
      } else {
        std::memcpy(out + offset, in + offset, n * row_bytes);
      }
    }
  });
  return dst;
}

}  // namespace

void copy_row_from_group(QuantFormat format, const uint8_t* group, int64_t r, int64_t blocks, uint8_t* row) {
  for_row_pieces(format, r, blocks, [&](int64_t in_row, int64_t in_group, int64_t n) {
    std::memcpy(row + in_row, group + in_group, n);
  });
}

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
  return block::has_rows16(format) ? preferred_quant_layout() : QuantLayout::kBlocks;
}

at::Tensor pack_blocks(QuantFormat format, const at::Tensor& blocks, const std::string& name) {
  return block::convert(format, /*pack=*/true, blocks, name);
}

at::Tensor unpack_blocks(QuantFormat format, const at::Tensor& packed, const std::string& name) {
  return block::convert(format, /*pack=*/false, packed, name);
}

}  // namespace torchpatch::nn
