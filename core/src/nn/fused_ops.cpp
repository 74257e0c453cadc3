// The arithmetic is the eager ops' own, in the same order and precision, so results match them to
// float rounding (RMSNorm's sum of squares is accumulated in double, as exact as the eager mean).
#include "nn/fused_ops.h"

#include <cmath>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

namespace torchpatch::nn {

bool fused_ops_apply(std::initializer_list<const at::Tensor*> tensors) {
  const bool grad = at::GradMode::is_enabled();
  for (const auto* t : tensors) {
    if (!t->defined() || t->scalar_type() != at::kFloat || !t->device().is_cpu()) return false;
    if (grad && t->requires_grad()) return false;
  }
  return true;
}

at::Tensor fused_rms_norm(const at::Tensor& x_in, const at::Tensor& weight_in, double eps, bool unit_offset) {
  const auto x = x_in.contiguous();
  const auto weight = weight_in.contiguous();
  const int64_t hidden = x.size(-1), rows = hidden == 0 ? 0 : x.numel() / hidden;
  auto out = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(hidden, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = xp + r * hidden;
      float* o = op + r * hidden;
      double squares = 0;
      for (int64_t i = 0; i < hidden; ++i) squares += static_cast<double>(xr[i]) * xr[i];
      const float mean = static_cast<float>(squares / static_cast<double>(hidden));
      const float scale = 1.0f / std::sqrt(mean + static_cast<float>(eps));
      if (unit_offset) {
        for (int64_t i = 0; i < hidden; ++i) o[i] = xr[i] * scale * (1.0f + wp[i]);
      } else {
        for (int64_t i = 0; i < hidden; ++i) o[i] = wp[i] * (xr[i] * scale);
      }
    }
  });
  return out;
}

at::Tensor fused_rotary(const at::Tensor& x, const at::Tensor& cos_in, const at::Tensor& sin_in) {
  const auto cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const int64_t b = x.size(0), heads = x.size(1), len = x.size(2), hd = x.size(3);
  const int64_t rot = cos.size(-1), half = rot / 2;
  auto out = at::empty({b, heads, len, hd}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t rows = b * heads * len;
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(hd, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t bi = r / (heads * len), h = r / len % heads, i = r % len;
      const float* xr = xp + bi * x.stride(0) + h * x.stride(1) + i * x.stride(2);
      const float* c = cp + (bi * len + i) * rot;
      const float* s = sp + (bi * len + i) * rot;
      float* o = op + r * hd;
      const int64_t step = x.stride(3);
      // x * cos + rotate_half(x) * sin, where rotate_half(x) = cat(-x2, x1)
      for (int64_t j = 0; j < half; ++j) {
        const float x1 = xr[j * step], x2 = xr[(j + half) * step];
        o[j] = x1 * c[j] + -x2 * s[j];
        o[j + half] = x2 * c[j + half] + x1 * s[j + half];
      }
      for (int64_t j = rot; j < hd; ++j) o[j] = xr[j * step];
    }
  });
  return out;
}

}  // namespace torchpatch::nn
