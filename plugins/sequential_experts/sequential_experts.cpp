// sequential-experts: one gated-MLP module per expert (`experts.{e}.gate_proj/up_proj/down_proj`),
// run one after another, instead of the fused [E, ...] parameters. Checkpoints keep Hugging Face's
// per-expert layout: the plugin's own (empty) conversion rules replace the model's fusing ones
// under every SequentialExperts module.
#include <ATen/ATen.h>

#include "torchpatch/models/blocks.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/patching/build.h"
#include "torchpatch/plugin_api.h"

namespace {

using torchpatch::BuildContext;

class SequentialExperts : public torchpatch::roles::Experts {
 public:
  explicit SequentialExperts(const BuildContext& ctx) {
    const auto& d = torchpatch::model_config(ctx).decoder;
    const torchpatch::nn::MlpOptions expert{d.hidden_size, d.moe.moe_intermediate_size, false, d.activation};
    for (int64_t e = 0; e < d.moe.num_experts; ++e) {
      torchpatch::BuildSubmodule expert_path(std::to_string(e));  // its projections sit at experts.{e}.*
      experts_.push_back(register_module(std::to_string(e), std::make_shared<torchpatch::nn::GatedMlp>(expert)));
    }
  }

 protected:

  // hidden [T, H], indices/weights [T, K]: each chosen expert on its tokens, added in expert order.
  at::Tensor forward_impl(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights) override {
    auto out = at::zeros_like(hidden);
    for (int64_t e = 0; e < static_cast<int64_t>(experts_.size()); ++e) {
      const auto hits = (indices == e).nonzero();  // [n, 2] (token, slot)
      if (hits.size(0) == 0) continue;
      const auto token = hits.select(1, 0), slot = hits.select(1, 1);
      auto y = experts_[e]->forward(hidden.index_select(0, token)) * weights.index({token, slot}).unsqueeze(-1);
      out.index_add_(0, token, y.to(out.scalar_type()));
    }
    return out;
  }
  int64_t expert_count() const override { return static_cast<int64_t>(experts_.size()); }

 private:
  std::vector<std::shared_ptr<torchpatch::nn::GatedMlp>> experts_;
};

void register_plugin(torchpatch::Registrar& registrar) {
  const torchpatch::DeviceTypes devices{c10::kCPU, c10::kCUDA};  // LibTorch's operations only
  registrar.add_replacement<SequentialExperts>("SequentialExperts",
                                              {torchpatch::PatchMapping::kind_key(torchpatch::block_kind::kExperts)}, devices);
  registrar.add_replacement<SequentialExperts>("ModuleListExperts", {}, devices);
  // The hub's experts.{e}.*.weight load as they are, renamed where the family names its projections
  // otherwise (Mixtral's w1/w3/w2 are gate/up/down).
  for (const char* cls : {"SequentialExperts", "ModuleListExperts"}) {
    registrar.add_conversion(cls, [](const torchpatch::Config& config) {
      const auto& layout = torchpatch::experts_layout(config.as<torchpatch::ModelConfig>());
      torchpatch::checkpoint::ConversionRules rules;
      const torchpatch::ExpertsLayout ours;
      for (const auto& [hub, own] : {std::pair{layout.gate, ours.gate}, {layout.up, ours.up}, {layout.down, ours.down}}) {
        if (hub != own) rules.push_back(torchpatch::checkpoint::WeightRenaming{"." + hub + ".weight", "." + own + ".weight"});
      }
      return rules;
    });
  }
}

}  // namespace

TORCHPATCH_PLUGIN("sequential-experts", "1.0.0", register_plugin)
