// The reference quantizer and dequantizer of GGUF's Q8_0 and Q4_0 blocks (nn/quant.h), and what the
// formats quant_linear multiplies are. Compiled with -ffp-contract=off (core/CMakeLists.txt): a fused
// `x * id + 8.5` rounds differently at ties.
#include "torchpatch/nn/quant.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <limits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/error.h"
#include "nn/quant_block.h"
#include "nn/quant_device.h"

namespace torchpatch::nn {

namespace {

constexpr int64_t kRowsPerTask = 16;

using block::load_half;
using block::store_half;

// A scaled value saturated into [low, high]; `1/d` overflows to infinity when d is subnormal.
float saturate(float v, float low, float high) { return std::isnan(v) ? 0.0f : std::clamp(v, low, high); }

// -- Q8_0: [d fp16][32 x int8] -------------------------------------------------------------------

void quantize_block_q8_0(const float* x, uint8_t* out) {
  float amax = 0.0f;
  for (int64_t j = 0; j < kQuantBlockSize; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_half(out, d);
  for (int64_t j = 0; j < kQuantBlockSize; ++j) {
    const float q = saturate(std::round(x[j] * id), -127.0f, 127.0f);  // std::round: half away from zero
    out[block::kScaleBytes + j] = static_cast<uint8_t>(static_cast<int8_t>(q));
  }
}

void dequantize_block_q8_0(const uint8_t* in, float* w) {
  const float d = load_half(in);
  const uint8_t* q = in + block::kScaleBytes;
  for (int64_t j = 0; j < kQuantBlockSize; ++j) w[j] = d * static_cast<float>(static_cast<int8_t>(q[j]));
}

// -- Q4_0: [d fp16][16 bytes: q[j] | q[j + 16] << 4] ----------------------------------------------

void quantize_block_q4_0(const float* x, uint8_t* out) {
  float amax = 0.0f;
  float max = 0.0f;  // the signed value of largest magnitude, the first one on ties
  for (int64_t j = 0; j < kQuantBlockSize; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_half(out, d);
  uint8_t q[kQuantBlockSize];
  for (int64_t j = 0; j < kQuantBlockSize; ++j) {
    const float scaled = x[j] * id;
    const float shifted = scaled + 8.5f;  // two roundings, never one fused multiply-add
    q[j] = static_cast<uint8_t>(saturate(std::trunc(shifted), 0.0f, 15.0f));
  }
  constexpr int64_t kHalf = kQuantBlockSize / 2;
  for (int64_t j = 0; j < kHalf; ++j) out[block::kScaleBytes + j] = static_cast<uint8_t>(q[j] | q[j + kHalf] << 4);
}

void dequantize_block_q4_0(const uint8_t* in, float* w) {
  const float d = load_half(in);
  constexpr int64_t kHalf = kQuantBlockSize / 2;
  for (int64_t j = 0; j < kHalf; ++j) {
    w[j] = d * static_cast<float>((in[block::kScaleBytes + j] & 0x0f) - 8);
    w[j + kHalf] = d * static_cast<float>((in[block::kScaleBytes + j] >> 4) - 8);
  }
}

// -- rows of blocks ---------------------------------------------------------------------------------

int64_t checked_blocks_per_row(int64_t in, const std::string& name, QuantFormat format) {
  if (in % kQuantBlockSize != 0 || in == 0) {
    throw InputError(fmt::format("tensor '{}': its input dimension {} is not a positive multiple of {}, the {} "
                                 "block size; keep it in float",
                                 name, in, kQuantBlockSize, format_name(format)));
  }
  return in / kQuantBlockSize;
}

}  // namespace

namespace {

struct FormatInfo {
  QuantFormat format;
  GgmlType type;
  const char* name;
};

constexpr FormatInfo kFormats[] = {
    {QuantFormat::kQ8_0, GgmlType::Q8_0, "q8_0"}, {QuantFormat::kQ4_0, GgmlType::Q4_0, "q4_0"},
    {QuantFormat::kQ4_1, GgmlType::Q4_1, "q4_1"}, {QuantFormat::kQ5_0, GgmlType::Q5_0, "q5_0"},
    {QuantFormat::kQ5_1, GgmlType::Q5_1, "q5_1"}, {QuantFormat::kQ2_K, GgmlType::Q2_K, "q2_k"},
    {QuantFormat::kQ3_K, GgmlType::Q3_K, "q3_k"}, {QuantFormat::kQ4_K, GgmlType::Q4_K, "q4_k"},
    {QuantFormat::kQ5_K, GgmlType::Q5_K, "q5_k"}, {QuantFormat::kQ6_K, GgmlType::Q6_K, "q6_k"},
};

const FormatInfo& info_of(QuantFormat format) { return kFormats[static_cast<int>(format)]; }

}  // namespace

int64_t block_weights(QuantFormat format) { return ggml_type_info(ggml_type(format)).block_size; }

int64_t block_bytes(QuantFormat format) { return ggml_type_info(ggml_type(format)).type_size; }

const char* format_name(QuantFormat format) { return info_of(format).name; }

bool quantizes_to(QuantFormat format) { return format == QuantFormat::kQ8_0 || format == QuantFormat::kQ4_0; }

GgmlType ggml_type(QuantFormat format) { return info_of(format).type; }

std::optional<QuantFormat> quant_format_of(GgmlType type) {
  for (const auto& f : kFormats) {
    if (f.type == type) return f.format;
  }
  return std::nullopt;
}

std::optional<QuantFormat> parse_quant_format(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto& f : kFormats) {
    if (lower == f.name) return f.format;
  }
  return std::nullopt;
}

at::Tensor quantize(QuantFormat format, const at::Tensor& weight, const std::string& name) {
  if (!weight.is_floating_point() || weight.dim() == 0) {
    throw InputError(fmt::format("tensor '{}': only floating-point tensors of at least one dimension are quantized, "
                                 "not {} {}",
                                 name, c10::toString(weight.scalar_type()), fmt::join(weight.sizes(), "x")));
  }
  if (!quantizes_to(format)) {
    throw InputError(fmt::format("tensor '{}': torchpatch quantizes to q8_0 and q4_0; {} blocks are read from GGUF "
                                 "files, not written",
                                 name, format_name(format)));
  }
  // GGUF's reference quantizer runs on the host: blocks of a device tensor are the same bytes.
  if (!weight.is_cpu()) return quantize(format, weight.cpu(), name).to(weight.device());
  const int64_t in = weight.size(-1);
  const int64_t blocks = checked_blocks_per_row(in, name, format);
  const at::Tensor x = weight.to(at::kFloat).contiguous();
  const int64_t rows = x.numel() / in;
  std::vector<int64_t> out_sizes(weight.sizes().begin(), weight.sizes().end());
  out_sizes.back() = blocks * block_bytes(format);
  at::Tensor out = at::empty(out_sizes, at::kByte);
  const float* src = x.data_ptr<float>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  const int64_t row_bytes = blocks * block_bytes(format);
  const auto quantize_block = format == QuantFormat::kQ8_0 ? quantize_block_q8_0 : quantize_block_q4_0;
  std::atomic<int64_t> first_bad{std::numeric_limits<int64_t>::max()};
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = src + r * in;
      for (int64_t j = 0; j < in; ++j) {
        if (!std::isfinite(row[j])) {
          int64_t seen = first_bad.load();
          while (r * in + j < seen && !first_bad.compare_exchange_weak(seen, r * in + j)) {
          }
          break;
        }
      }
      for (int64_t b = 0; b < blocks; ++b) {
        quantize_block(row + b * kQuantBlockSize, dst + r * row_bytes + b * block_bytes(format));
      }
    }
  });
  if (const int64_t bad = first_bad.load(); bad != std::numeric_limits<int64_t>::max()) {
    throw InputError(fmt::format("tensor '{}': value {} at flat index {} is not finite; it cannot be quantized",
                                 name, src[bad], bad));
  }
  return out;
}

at::Tensor dequantize(QuantFormat format, const at::Tensor& blocks, const std::string& name) {
  const int64_t bytes = block_bytes(format);
  if (blocks.scalar_type() != at::kByte || blocks.dim() == 0 || blocks.size(-1) % bytes != 0 || blocks.size(-1) == 0) {
    throw InputError(fmt::format("tensor '{}': {} blocks are uint8 rows of whole {}-byte blocks, not {} {}", name,
                                 format_name(format), bytes, c10::toString(blocks.scalar_type()),
                                 fmt::join(blocks.sizes(), "x")));
  }
  if (!quantizes_to(format)) {  // GGML's dequantizer, on the host
    const at::Tensor q = blocks.cpu().contiguous();
    std::vector<int64_t> out_sizes(q.sizes().begin(), q.sizes().end());
    out_sizes.back() = q.size(-1) / bytes * block_weights(format);
    at::Tensor out = at::empty(out_sizes, at::kFloat);
    dequantize_ggml(ggml_type(format), q.data_ptr<uint8_t>(), out.numel(), out.data_ptr<float>());
    return out.to(blocks.device());
  }
  if (blocks.is_cuda()) return cuda_dequantize(format, blocks, name);
  const at::Tensor q = blocks.contiguous();
  const int64_t per_row = q.size(-1) / bytes;
  const int64_t rows = q.numel() / q.size(-1);
  std::vector<int64_t> out_sizes(q.sizes().begin(), q.sizes().end());
  out_sizes.back() = per_row * kQuantBlockSize;
  at::Tensor out = at::empty(out_sizes, at::kFloat);
  const uint8_t* src = q.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  const auto dequantize_block = format == QuantFormat::kQ8_0 ? dequantize_block_q8_0 : dequantize_block_q4_0;
  at::parallel_for(0, rows * per_row, kRowsPerTask * per_row, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) dequantize_block(src + b * bytes, dst + b * kQuantBlockSize);
  });
  return out;
}

}  // namespace torchpatch::nn
