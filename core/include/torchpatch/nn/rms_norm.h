// RMSNorm as the decoder families use it: variance in float32, cast back, then scaled by the weight.
#pragma once

#include "torchpatch/export.h"

#include "torchpatch/patching/roles.h"

namespace torchpatch::nn {

class TORCHPATCH_API RmsNorm : public roles::Norm {
 public:
  RmsNorm(int64_t hidden_size, double eps);
  /// hidden_size and rms_norm_eps from the decoder config.
  explicit RmsNorm(const BuildContext& ctx);

  at::Tensor forward(const at::Tensor& x) override;

  at::Tensor weight;  ///< [H], initialised to ones
  double variance_epsilon;
};

}  // namespace torchpatch::nn
