// replayable-router: the Qwen MoE top-k routers, able to replay recorded routes. While routes are
// forced (torchpatch::ReplayMoeRouting), the router returns them as its choice and recomputes their
// weights from its live logits, so a training pass routes exactly as the recorded one did and the
// router still gets gradients.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/models/qwen2_moe.h"
#include "torchpatch/models/qwen3_moe.h"
#include "torchpatch/moe/routing.h"
#include "torchpatch/plugin_api.h"

namespace {

template <class Router>
class Replayable : public Router, public torchpatch::ReplayableRouter {
 public:
  using Router::Router;

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

using ReplayableQwen2MoeTopKRouter = Replayable<torchpatch::qwen2_moe::Qwen2MoeTopKRouter>;
using ReplayableQwen3MoeTopKRouter = Replayable<torchpatch::qwen3_moe::Qwen3MoeTopKRouter>;

void register_plugin(torchpatch::Registrar& registrar) {
  registrar.add_replacement<ReplayableQwen2MoeTopKRouter>("ReplayableQwen2MoeTopKRouter", {"Qwen2MoeTopKRouter"});
  registrar.add_replacement<ReplayableQwen3MoeTopKRouter>("ReplayableQwen3MoeTopKRouter", {"Qwen3MoeTopKRouter"});
}

}  // namespace

TORCHPATCH_PLUGIN("replayable-router", "1.0.0", register_plugin)
