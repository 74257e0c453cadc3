// Test plugin "least_likely_router": a deliberately wrong Qwen2-MoE router that sends each token to
// its least likely experts, so `torchpatch verify` has expert choices that disagree to report.
#include "torchpatch/models/qwen2_moe.h"
#include "torchpatch/nn/moe.h"
#include "torchpatch/plugin_api.h"

namespace {

class LeastLikelyRouter : public torchpatch::qwen2_moe::Qwen2MoeTopKRouter {
 public:
  using Qwen2MoeTopKRouter::Qwen2MoeTopKRouter;

 protected:

  torchpatch::RouterOutput forward_impl(const at::Tensor& hidden) override {
    auto out = Qwen2MoeTopKRouter::forward_impl(hidden);
    out.indices = torchpatch::nn::route_top_k(-out.logits, top_k, norm_topk_prob).indices;
    out.scores = torchpatch::nn::scores_for(out.logits, out.indices, norm_topk_prob);
    return out;
  }
};

void register_plugin(torchpatch::Registrar& registrar) {
  registrar.add_replacement<LeastLikelyRouter>("LeastLikelyRouter", {"Qwen2MoeTopKRouter"});
}

}  // namespace

TORCHPATCH_PLUGIN("least-likely-router", "1.0.0", register_plugin)
