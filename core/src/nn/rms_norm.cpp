#include "torchpatch/nn/rms_norm.h"

#include <ATen/ATen.h>

#include "nn/fused_ops.h"
#include "torchpatch/nn/linear.h"

namespace torchpatch::nn {

RmsNorm::RmsNorm(int64_t hidden_size, double eps, bool unit_offset)
    : variance_epsilon(eps), unit_offset(unit_offset) {
  weight = register_parameter("weight", unit_offset ? at::zeros({hidden_size}) : at::ones({hidden_size}));
}

at::Tensor RmsNorm::forward(const at::Tensor& x) {
  if (x.dim() > 0 && fused_ops_apply({&x, &weight})) return fused_rms_norm(x, weight, variance_epsilon, unit_offset);
  const auto input_dtype = x.scalar_type();
  const auto reduced = reduction_type(input_dtype);
  auto h = x.to(reduced);
  h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + variance_epsilon);
  if (unit_offset) return (h * (1.0 + weight.to(reduced))).to(input_dtype);  // Gemma: multiply, then cast
  return weight * h.to(input_dtype);  // cast before the weight, as Hugging Face does
}

}  // namespace torchpatch::nn
