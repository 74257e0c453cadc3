// RMSNorm as the decoder families use it: variance in float32, then scaled by the weight.
#pragma once

#include "torchpatch/export.h"

#include "torchpatch/patching/roles.h"

namespace torchpatch::nn {

class TORCHPATCH_API RmsNorm : public roles::Norm {
 public:
  /// Llama's form: cast back to the input dtype, then `weight * x` (weight initialised to ones).
  /// With `unit_offset` Gemma's: `x * (1 + weight)` in float32, then cast back (weight initialised
  /// to zeros).
  RmsNorm(int64_t hidden_size, double eps, bool unit_offset = false);

  at::Tensor forward(const at::Tensor& x) override;

  at::Tensor weight;  ///< [H]
  double variance_epsilon;
  bool unit_offset;
};

}  // namespace torchpatch::nn
