// The gated feed-forward block of the decoder families: down(act(gate(x)) * up(x)).
#pragma once

#include "torchpatch/export.h"

#include <string>

#include "torchpatch/nn/linear.h"
#include "torchpatch/patching/roles.h"

namespace torchpatch::nn {

/// The activations a config's `hidden_act` can name, resolved once when the config is read.
enum class Activation { kSilu, kGelu, kGeluTanh, kRelu };

/// "silu"/"swish", "gelu", "gelu_pytorch_tanh"/"gelu_new", "relu"; ConfigError "FIELD: unsupported
/// activation 'NAME'" for any other name.
TORCHPATCH_API Activation parse_activation(const std::string& name, const std::string& field = "hidden_act");
TORCHPATCH_API at::Tensor activate(Activation act, const at::Tensor& x);
/// parse_activation then activate (for code that holds a name).
TORCHPATCH_API at::Tensor activation(const std::string& name, const at::Tensor& x);

struct TORCHPATCH_API MlpOptions {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  bool bias = false;
  Activation act = Activation::kSilu;
};

/// gate_proj [I, H], up_proj [I, H], down_proj [H, I].
class TORCHPATCH_API GatedMlp : public roles::Mlp {
 public:
  explicit GatedMlp(const MlpOptions& options);

  at::Tensor forward(const at::Tensor& x) override;

  std::shared_ptr<roles::Linear> gate_proj, up_proj, down_proj;
  Activation act;
};

}  // namespace torchpatch::nn
