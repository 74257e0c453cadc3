// Random blocks of GGUF's formats for the kernel and loading tests: any bytes, except the fp16
// scales, which are set to small finite values.
#pragma once

#include <vector>

#include <ATen/ATen.h>

#include "torchpatch/nn/quant.h"

namespace testutil {

/// [rows, in / block_weights * block_bytes] uint8 blocks of `format`.
inline at::Tensor random_blocks(torchpatch::nn::QuantFormat format, int64_t rows, int64_t in) {
  using torchpatch::nn::QuantFormat;
  const int64_t bytes = torchpatch::nn::block_bytes(format), blocks = in / torchpatch::nn::block_weights(format);
  auto t = at::randint(0, 256, {rows, blocks, bytes}, at::kByte);
  std::vector<int64_t> scales;  // byte offsets of the fp16 fields in a block
  switch (format) {
    case QuantFormat::kQ4_1: case QuantFormat::kQ5_1: case QuantFormat::kQ4_K: case QuantFormat::kQ5_K: scales = {0, 2}; break;
    case QuantFormat::kQ2_K: scales = {80, 82}; break;
    case QuantFormat::kQ3_K: scales = {108}; break;
    case QuantFormat::kQ6_K: scales = {208}; break;
    default: scales = {0}; break;  // Q8_0, Q4_0, Q5_0
  }
  for (const int64_t at : scales) {
    const auto values = (at::rand({rows, blocks}) * 0.01 + 0.001).to(at::kHalf).view(at::kByte);
    t.narrow(2, at, 2).copy_(values.reshape({rows, blocks, 2}));
  }
  return t.reshape({rows, blocks * bytes});
}

}  // namespace testutil
