#include "torchpatch/nn/rotary.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "nn/fused_ops.h"
#include "torchpatch/error.h"
#include "torchpatch/printable.h"

namespace torchpatch::nn {

namespace {

int64_t rotary_dim(const RopeOptions& options) {
  return static_cast<int64_t>(static_cast<double>(options.head_dim) * options.rope.partial_rotary_factor);
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

// Dynamic NTK: the base grows with the sequence once it passes the trained length.
double dynamic_base(const RopeParameters& rope, int64_t dim, int64_t max_positions, int64_t seq_len) {
  const double len = static_cast<double>(seq_len > max_positions ? seq_len : max_positions);
  const double ratio = rope.factor * len / static_cast<double>(max_positions) - (rope.factor - 1);
  return rope.theta * std::pow(ratio, static_cast<double>(dim) / static_cast<double>(dim - 2));
}

double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// YaRN: interpolated frequencies (divided by factor) for the long wavelengths, the original ones for
// the short, a linear ramp between the correction dimensions (found at the trained length); cos/sin
// scaled by the attention factor. The configured factor is used as given (Hugging Face for a while
// replaced it by max_position_embeddings / original_max_position_embeddings, which turns YaRN off
// for configs such as Qwen2.5's that leave max_position_embeddings at the trained length).
RopeFrequencies yarn_frequencies(const RopeParameters& rope, int64_t dim, int64_t max_position_embeddings) {
  const double factor = rope.factor;
  const int64_t original_max =
      rope.original_max_position_embeddings > 0 ? rope.original_max_position_embeddings : max_position_embeddings;
  RopeFrequencies out;
  if (rope.attention_factor) {
    out.attention_scaling = *rope.attention_factor;
  } else if (rope.mscale && rope.mscale_all_dim) {
    out.attention_scaling = yarn_mscale(factor, *rope.mscale) / yarn_mscale(factor, *rope.mscale_all_dim);
  } else {
    out.attention_scaling = yarn_mscale(factor, 1.0);
  }
  const double base = rope.theta;
  auto correction_dim = [&](double rotations) {
    return static_cast<double>(dim) * std::log(static_cast<double>(original_max) / (rotations * 2 * M_PI)) /
           (2 * std::log(base));
  };
  double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // the original's guard against a zero-width ramp
  auto pos_freqs = at::pow(base, at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim));
  auto extrapolation = 1.0 / pos_freqs;
  auto interpolation = 1.0 / (factor * pos_freqs);
  auto ramp = ((at::arange(dim / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);
  auto extrapolation_weight = 1 - ramp;
  out.inv_freq = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight;
  return out;
}

// Phi-3's LongRoPE: each frequency divided by its own factor, the long set past the trained length;
// cos/sin scaled by sqrt(1 + ln(scale) / ln(original)) when the context was extended.
RopeFrequencies longrope_frequencies(const RopeOptions& options, int64_t dim, int64_t seq_len) {
  const auto& rope = options.rope;
  const int64_t original = rope.original_max_position_embeddings > 0 ? rope.original_max_position_embeddings
                                                                     : options.max_position_embeddings;
  const auto& factors = seq_len > original ? rope.long_factor : rope.short_factor;
  if (static_cast<int64_t>(factors.size()) != dim / 2) {
    throw ConfigError(fmt::format("rope_scaling: longrope needs {} factors (rotary dimension {} / 2), got {}", dim / 2,
                                  dim, factors.size()));
  }
  auto ext = at::tensor(std::vector<float>(factors.begin(), factors.end()), at::kFloat);
  auto exponents = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim);
  RopeFrequencies out;
  out.inv_freq = 1.0 / (ext * at::pow(rope.theta, exponents));
  const double scale = static_cast<double>(options.max_position_embeddings) / static_cast<double>(original);
  out.attention_scaling = scale <= 1.0 ? 1.0 : std::sqrt(1 + std::log(scale) / std::log(static_cast<double>(original)));
  return out;
}

}  // namespace

RopeFrequencies rope_frequencies(const RopeOptions& options, int64_t seq_len) {
  const auto& rope = options.rope;
  const int64_t dim = rotary_dim(options);
  RopeFrequencies out;
  switch (rope.kind) {
    case RopeKind::kDynamic:
      out.inv_freq = default_inv_freq(dynamic_base(rope, dim, options.max_position_embeddings, seq_len), dim);
      return out;
    case RopeKind::kDefault: out.inv_freq = default_inv_freq(rope.theta, dim); return out;
    case RopeKind::kLinear: out.inv_freq = default_inv_freq(rope.theta, dim) / rope.factor; return out;
    case RopeKind::kLlama3: out.inv_freq = llama3_inv_freq(default_inv_freq(rope.theta, dim), rope); return out;
    case RopeKind::kYarn: return yarn_frequencies(rope, dim, options.max_position_embeddings);
    case RopeKind::kLongrope: return longrope_frequencies(options, dim, seq_len);
  }
  throw ConfigError(fmt::format("rope_scaling: unsupported rope_type '{}'", printable(rope.rope_type, 200)));
}

RotaryEmbedding::RotaryEmbedding(const RopeOptions& options)
    : options_(options),
      freq_(rope_frequencies(options)),
      original_(freq_),
      max_seq_len_cached_(options.max_position_embeddings),
      dynamic_mutex_(std::make_shared<std::mutex>()) {
  if (options.rope.kind == RopeKind::kLongrope) {
    // Both factor sets, computed (and checked) once: a forward only picks one.
    longrope_threshold_ = options.rope.original_max_position_embeddings > 0 ? options.rope.original_max_position_embeddings
                                                                            : options.max_position_embeddings;
    long_ = rope_frequencies(options, longrope_threshold_ + 1);
  }
}

RopeFrequencies RotaryEmbedding::dynamic_update(int64_t seq_len) {
  std::lock_guard<std::mutex> lock(*dynamic_mutex_);
  const int64_t original_max = options_.max_position_embeddings;
  if (seq_len > max_seq_len_cached_) {  // grow
    freq_ = rope_frequencies(options_, seq_len);
    max_seq_len_cached_ = seq_len;
  }
  if (seq_len < original_max && max_seq_len_cached_ > original_max) {  // reset
    freq_ = original_;
    max_seq_len_cached_ = original_max;
  }
  return freq_;
}

at::Tensor RotaryEmbedding::inv_freq_on(const at::Tensor& inv_freq, c10::Device device) {
  if (inv_freq.device() == device) return inv_freq;
  std::lock_guard<std::mutex> lock(*dynamic_mutex_);
  if (!device_inv_freq_.defined() || !device_source_.is_same(inv_freq) || device_inv_freq_.device() != device) {
    device_inv_freq_ = inv_freq.to(device);
    device_source_ = inv_freq;
  }
  return device_inv_freq_;
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::forward(const at::Tensor& position_ids, c10::ScalarType dtype) {
  RopeFrequencies freq = freq_;
  if (options_.rope.kind == RopeKind::kDynamic) freq = dynamic_update(position_ids.max().item<int64_t>() + 1);
  if (options_.rope.kind == RopeKind::kLongrope && position_ids.max().item<int64_t>() + 1 > longrope_threshold_) {
    freq = long_;
  }
  // freqs [B, Q, rot/2] = position * inv_freq, in float32 (a product, as the original's matmul with K=1)
  const auto inv_freq = inv_freq_on(freq.inv_freq, position_ids.device());
  auto freqs = position_ids.to(at::kFloat).unsqueeze(-1) * inv_freq.unsqueeze(0).unsqueeze(0);
  auto emb = at::cat({freqs, freqs}, -1);
  auto cos = emb.cos();
  auto sin = emb.sin();
  if (freq.attention_scaling != 1.0) {
    cos = cos * freq.attention_scaling;
    sin = sin * freq.attention_scaling;
  }
  return {cos.to(dtype), sin.to(dtype)};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t rot = cos.size(-1);
  const int64_t hd = x.size(-1);
  if (x.dim() == 4 && cos.dim() == 3 && rot % 2 == 0 && rot <= hd && cos.size(0) == x.size(0) &&
      cos.size(1) == x.size(2) && sin.sizes() == cos.sizes() && fused_ops_apply({&x, &cos, &sin})) {
    return fused_rotary(x, cos, sin);
  }
  auto c = cos.unsqueeze(1);  // [B, 1, Q, rot]
  auto s = sin.unsqueeze(1);
  auto x_rot = rot == hd ? x : x.narrow(-1, 0, rot);
  auto x1 = x_rot.narrow(-1, 0, rot / 2);
  auto x2 = x_rot.narrow(-1, rot / 2, rot / 2);
  auto rotated = x_rot * c + at::cat({-x2, x1}, -1) * s;
  return rot == hd ? rotated : at::cat({rotated, x.narrow(-1, rot, hd - rot)}, -1);
}

}  // namespace torchpatch::nn
