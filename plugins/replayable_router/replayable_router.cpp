// replayable-router: the softmax top-k router of every MoE family (the `router` kind: Qwen2-MoE,
// Qwen3-MoE, Mixtral, OLMoE, ...), able to replay recorded routes. While routes are
// forced (torchpatch::ReplayMoeRouting), the router returns them as its choice and recomputes their
// weights from its live logits, so a training pass routes exactly as the recorded one did and the
// router still gets gradients.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/models/blocks.h"
#include "torchpatch/nn/moe.h"
#include "torchpatch/moe/routing.h"
#include "torchpatch/plugin_api.h"

namespace {

class ReplayableTopKRouter : public torchpatch::nn::TopKRouter, public torchpatch::ReplayableRouter {
 public:
  using Router = torchpatch::nn::TopKRouter;
  explicit ReplayableTopKRouter(const torchpatch::BuildContext& ctx)
      : TopKRouter(torchpatch::router_options(torchpatch::model_config(ctx).decoder)) {}

  void force_routes(const at::Tensor& indices) override { forced_ = indices; }

 protected:
  torchpatch::RouterOutput forward_impl(const at::Tensor& hidden) override {
    if (!forced_.defined()) return Router::forward_impl(hidden);
    if (forced_.size(0) != hidden.size(0)) {
      throw torchpatch::InputError(fmt::format("replay: router at {} got {} tokens, the routes have {}",
                                               this->patch_record().path, hidden.size(0), forced_.size(0)));
    }
    const auto logits = torchpatch::nn::linear(hidden, this->weight);
    return {logits, torchpatch::nn::scores_for(logits, forced_, this->norm_topk_prob), forced_};
  }

 private:
  at::Tensor forced_;
};


void register_plugin(torchpatch::Registrar& registrar) {
  registrar.add_replacement<ReplayableTopKRouter>(
      "ReplayableTopKRouter", {torchpatch::PatchMapping::kind_key(torchpatch::block_kind::kRouter)});
}

}  // namespace

TORCHPATCH_PLUGIN("replayable-router", "1.0.0", register_plugin)
