// The gated feed-forward block of the decoder families: down(act(gate(x)) * up(x)).
#pragma once

#include "torchpatch/export.h"


#include "torchpatch/nn/linear.h"
#include "torchpatch/patching/roles.h"

namespace torchpatch::nn {

/// The activation named by a config's `hidden_act` ("silu", "gelu", "gelu_pytorch_tanh", "relu").
/// Throws ConfigError for any other name.
TORCHPATCH_API at::Tensor activation(const std::string& name, const at::Tensor& x);

class TORCHPATCH_API GatedMlp : public roles::Mlp {
 public:
  /// hidden_size -> intermediate_size (ctx.intermediate_size when set) -> hidden_size, bias per config.mlp_bias.
  explicit GatedMlp(const BuildContext& ctx);
  GatedMlp(const BuildContext& ctx, int64_t intermediate_size);

  at::Tensor forward(const at::Tensor& x) override;

  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
  std::string hidden_act;
};

}  // namespace torchpatch::nn
