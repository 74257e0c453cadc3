#include "torchpatch/nn/layer_norm.h"

#include <ATen/ATen.h>

namespace torchpatch::nn {

LayerNorm::LayerNorm(int64_t hidden_size, double eps) : eps(eps) {
  weight = register_parameter("weight", at::ones({hidden_size}));
  bias = register_parameter("bias", at::zeros({hidden_size}));
}

at::Tensor LayerNorm::forward(const at::Tensor& x) const {
  return at::layer_norm(x, {x.size(-1)}, weight, bias, eps);
}

}  // namespace torchpatch::nn
