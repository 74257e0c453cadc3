// first-plugin: Llama's feed-forward block written out on the Mlp role. It has the parameters of the
// built-in LlamaMLP under Hugging Face's names (gate_proj, up_proj, down_proj), so Llama checkpoints
// load as they are, computes the same result, and counts the tokens it has processed.
#include <atomic>

#include <ATen/ATen.h>

#include "torchpatch/error.h"
#include "torchpatch/models/blocks.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/patching/roles.h"
#include "torchpatch/plugin_api.h"

namespace {

// Projections through the "Linear" patch point, so --quantize and other Linear replacements reach them.
using torchpatch::nn::make_linear;

class MyLlamaMLP : public torchpatch::roles::Mlp {
 public:
  explicit MyLlamaMLP(const torchpatch::BuildContext& ctx) {
    const auto& config = torchpatch::model_config(ctx).decoder;  // the model's config.json, typed
    if (config.hidden_act != "silu") throw torchpatch::ConfigError("MyLlamaMLP: hidden_act must be silu");
    const int64_t hidden = config.hidden_size, inner = config.intermediate_size;
    gate_proj = register_module("gate_proj", make_linear("gate_proj", hidden, inner, config.mlp_bias));
    up_proj = register_module("up_proj", make_linear("up_proj", hidden, inner, config.mlp_bias));
    down_proj = register_module("down_proj", make_linear("down_proj", inner, hidden, config.mlp_bias));
  }

  // x [..., hidden] -> [..., hidden]: down(silu(gate(x)) * up(x))
  at::Tensor forward(const at::Tensor& x) override {
    tokens_ += x.numel() / x.size(-1);
    return down_proj->forward(at::silu(gate_proj->forward(x)) * up_proj->forward(x));
  }

  // Shown by `torchpatch run` and `generate`, summed over the model's MyLlamaMLP modules.
  std::map<std::string, int64_t> counters() const override { return {{"tokens", tokens_.load()}}; }

  std::shared_ptr<torchpatch::roles::Linear> gate_proj, up_proj, down_proj;

 private:
  std::atomic<int64_t> tokens_{0};
};

// Called once when the host loads the plugin; no work happens before.
void register_plugin(torchpatch::Registrar& registrar) {
  registrar.add_replacement<MyLlamaMLP>("MyLlamaMLP", {"LlamaMLP"});  // class name, the keys it replaces
}

}  // namespace

TORCHPATCH_PLUGIN("first-plugin", "0.1.0", register_plugin)
