#include "torchpatch/nn/rms_norm.h"

#include <ATen/ATen.h>

#include "torchpatch/models/config.h"
#include "torchpatch/nn/linear.h"

namespace torchpatch::nn {

RmsNorm::RmsNorm(int64_t hidden_size, double eps) : variance_epsilon(eps) {
  weight = register_parameter("weight", at::ones({hidden_size}));
}

RmsNorm::RmsNorm(const BuildContext& ctx)
    : RmsNorm(ctx.config.decoder.hidden_size, ctx.config.decoder.rms_norm_eps) {}

at::Tensor RmsNorm::forward(const at::Tensor& x) {
  const auto input_dtype = x.scalar_type();
  auto h = x.to(reduction_type(input_dtype));
  h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + variance_epsilon);
  return weight * h.to(input_dtype);  // cast before the weight, as Hugging Face does
}

}  // namespace torchpatch::nn
