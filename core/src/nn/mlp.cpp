#include "torchpatch/nn/mlp.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/printable.h"

namespace torchpatch::nn {

Activation parse_activation(const std::string& name, const std::string& field) {
  if (name == "silu" || name == "swish") return Activation::kSilu;
  if (name == "gelu") return Activation::kGelu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new") return Activation::kGeluTanh;
  if (name == "relu") return Activation::kRelu;
  throw ConfigError(fmt::format("{}: unsupported activation '{}'", field, printable(name, 200)));
}

at::Tensor activate(Activation act, const at::Tensor& x) {
  switch (act) {
    case Activation::kSilu: return at::silu(x);
    case Activation::kGelu: return at::gelu(x);
    case Activation::kGeluTanh: return at::gelu(x, "tanh");
    case Activation::kRelu: return at::relu(x);
  }
  return x;
}

at::Tensor activation(const std::string& name, const at::Tensor& x) { return activate(parse_activation(name), x); }

GatedMlp::GatedMlp(const MlpOptions& o) : act(o.act) {
  gate_proj = register_module("gate_proj", make_linear("gate_proj", o.hidden_size, o.intermediate_size, o.bias));
  up_proj = register_module("up_proj", make_linear("up_proj", o.hidden_size, o.intermediate_size, o.bias));
  down_proj = register_module("down_proj", make_linear("down_proj", o.intermediate_size, o.hidden_size, o.bias));
}

at::Tensor GatedMlp::forward(const at::Tensor& x) {
  return down_proj->forward(activate(act, gate_proj->forward(x)) * up_proj->forward(x));
}

}  // namespace torchpatch::nn
