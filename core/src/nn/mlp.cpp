#include "torchpatch/nn/mlp.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/models/config.h"

namespace torchpatch::nn {

at::Tensor activation(const std::string& name, const at::Tensor& x) {
  if (name == "silu" || name == "swish") return at::silu(x);
  if (name == "gelu") return at::gelu(x);
  if (name == "gelu_pytorch_tanh" || name == "gelu_new") return at::gelu(x, "tanh");
  if (name == "relu") return at::relu(x);
  throw ConfigError(fmt::format("hidden_act: unsupported activation '{}'", name));
}

GatedMlp::GatedMlp(const BuildContext& ctx)
    : GatedMlp(ctx, ctx.intermediate_size > 0 ? ctx.intermediate_size : ctx.config.decoder.intermediate_size) {}

GatedMlp::GatedMlp(const BuildContext& ctx, int64_t intermediate_size)
    : hidden_act(ctx.config.decoder.hidden_act) {
  const auto& cfg = ctx.config.decoder;
  const auto h = cfg.hidden_size;
  gate_proj = register_module("gate_proj", std::make_shared<Linear>(h, intermediate_size, cfg.mlp_bias));
  up_proj = register_module("up_proj", std::make_shared<Linear>(h, intermediate_size, cfg.mlp_bias));
  down_proj = register_module("down_proj", std::make_shared<Linear>(intermediate_size, h, cfg.mlp_bias));
  activation(hidden_act, at::zeros({1}));  // reject an unknown activation at build time, not mid-forward
}

at::Tensor GatedMlp::forward(const at::Tensor& x) {
  return down_proj->forward(activation(hidden_act, gate_proj->forward(x)) * up_proj->forward(x));
}

}  // namespace torchpatch::nn
