// LayerNorm as BERT uses it (torch.nn.LayerNorm over the last dimension, with weight and bias).
#pragma once

#include "torchpatch/export.h"

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

namespace torchpatch::nn {

class TORCHPATCH_API LayerNorm : public torch::nn::Module {
 public:
  LayerNorm(int64_t hidden_size, double eps);
  at::Tensor forward(const at::Tensor& x) const;

  at::Tensor weight;  ///< [H], initialised to ones
  at::Tensor bias;    ///< [H], initialised to zeros
  double eps;
};

}  // namespace torchpatch::nn
