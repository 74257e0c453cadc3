#include "torchpatch/nn/rotary.h"

#include <cmath>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "torchpatch/error.h"

namespace torchpatch::nn {

namespace {

int64_t rotary_dim(const DecoderConfig& config) {
  return static_cast<int64_t>(static_cast<double>(config.head_dim) * config.rope.partial_rotary_factor);
}

// inv_freq = 1 / base ** (arange(0, dim, 2) / dim), in float32 like the Python original.
at::Tensor default_inv_freq(double base, int64_t dim) {
  auto exponents = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim);
  return 1.0 / at::pow(base, exponents);
}

// Llama 3.1: low frequencies divided by `factor`, high ones kept, a smooth blend in between.
at::Tensor llama3_inv_freq(const at::Tensor& inv_freq, const RopeParameters& rope) {
  const double old_ctx = static_cast<double>(rope.original_max_position_embeddings);
  const double low_wavelen = old_ctx / rope.low_freq_factor;
  const double high_wavelen = old_ctx / rope.high_freq_factor;
  auto wavelen = 2 * M_PI / inv_freq;
  auto inv_low = at::where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq);
  auto smooth = (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
  auto smoothed = (1 - smooth) * inv_low / rope.factor + smooth * inv_low;
  auto is_medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return at::where(is_medium, smoothed, inv_low);
}

}  // namespace

RopeFrequencies rope_frequencies(const DecoderConfig& config) {
  const auto& rope = config.rope;
  const int64_t dim = rotary_dim(config);
  RopeFrequencies out;
  out.inv_freq = default_inv_freq(rope.theta, dim);
  if (rope.rope_type == "default") return out;
  if (rope.rope_type == "llama3") {
    out.inv_freq = llama3_inv_freq(out.inv_freq, rope);
    return out;
  }
  throw ConfigError(fmt::format("rope_scaling: unsupported rope_type '{}' (supported: default, llama3)",
                                rope.rope_type));
}

RotaryEmbedding::RotaryEmbedding(const DecoderConfig& config) : freq_(rope_frequencies(config)) {}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::forward(const at::Tensor& position_ids,
                                                           c10::ScalarType dtype) const {
  // freqs [B, Q, rot/2] = position * inv_freq, in float32 (a product, as the original's matmul with K=1)
  auto freqs = position_ids.to(at::kFloat).unsqueeze(-1) * freq_.inv_freq.unsqueeze(0).unsqueeze(0);
  auto emb = at::cat({freqs, freqs}, -1);
  auto cos = emb.cos();
  auto sin = emb.sin();
  if (freq_.attention_scaling != 1.0) {
    cos = cos * freq_.attention_scaling;
    sin = sin * freq_.attention_scaling;
  }
  return {cos.to(dtype), sin.to(dtype)};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t rot = cos.size(-1);
  const int64_t hd = x.size(-1);
  auto c = cos.unsqueeze(1);  // [B, 1, Q, rot]
  auto s = sin.unsqueeze(1);
  auto x_rot = rot == hd ? x : x.narrow(-1, 0, rot);
  auto x1 = x_rot.narrow(-1, 0, rot / 2);
  auto x2 = x_rot.narrow(-1, rot / 2, rot / 2);
  auto rotated = x_rot * c + at::cat({-x2, x1}, -1) * s;
  return rot == hd ? rotated : at::cat({rotated, x.narrow(-1, rot, hd - rot)}, -1);
}

}  // namespace torchpatch::nn
