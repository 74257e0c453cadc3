// replayable-router: the routers of every MoE family, by kind (the softmax top-k `router`: Qwen2-MoE,
// Qwen3-MoE, Mixtral, OLMoE; the DeepSeek-style `grouped_router`: GLM-4.5), able to replay recorded
// routes. While routes are
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

// A router block made replayable: while routes are forced it returns them, with the weights its own
// rule gives those experts from its live logits (`weights_for`).
template <class Router>
class Replayable : public Router, public torchpatch::ReplayableRouter {
 public:
  template <class Options>
  explicit Replayable(const Options& options) : Router(options) {}

  void force_routes(const at::Tensor& indices) override { forced_ = indices; }

 protected:
  virtual at::Tensor logits(const at::Tensor& hidden) = 0;
  virtual at::Tensor weights_for(const at::Tensor& logits, const at::Tensor& indices) = 0;

  torchpatch::RouterOutput forward_impl(const at::Tensor& hidden) override {
    if (!forced_.defined()) return Router::forward_impl(hidden);
    if (forced_.size(0) != hidden.size(0)) {
      throw torchpatch::InputError(fmt::format("replay: router at {} got {} tokens, the routes have {}",
                                               this->patch_record().path, hidden.size(0), forced_.size(0)));
    }
    const auto live = logits(hidden);
    return {live, weights_for(live, forced_), forced_};
  }

 private:
  at::Tensor forced_;
};

// The softmax top-k router (the `router` kind).
class ReplayableTopKRouter : public Replayable<torchpatch::nn::TopKRouter> {
 public:
  explicit ReplayableTopKRouter(const torchpatch::BuildContext& ctx)
      : Replayable(torchpatch::router_options(torchpatch::model_config(ctx).decoder)) {}

 protected:
  at::Tensor logits(const at::Tensor& hidden) override { return torchpatch::nn::linear(hidden, weight); }
  at::Tensor weights_for(const at::Tensor& logits, const at::Tensor& indices) override {
    return torchpatch::nn::scores_for(logits, indices, norm_topk_prob);
  }
};

// The DeepSeek-style router (the `grouped_router` kind: GLM-4.5, DeepSeek-V3).
class ReplayableGroupedTopKRouter : public Replayable<torchpatch::nn::GroupedTopKRouter> {
 public:
  explicit ReplayableGroupedTopKRouter(const torchpatch::BuildContext& ctx)
      : Replayable(torchpatch::grouped_router_options(torchpatch::model_config(ctx).decoder)) {}

 protected:
  at::Tensor logits(const at::Tensor& hidden) override {
    return at::linear(hidden.to(at::kFloat), weight.to(at::kFloat));
  }
  at::Tensor weights_for(const at::Tensor& logits, const at::Tensor& indices) override {
    return torchpatch::nn::grouped_scores_for(logits, indices, options.norm_topk_prob, options.routed_scaling_factor);
  }
};

// GPT-OSS's router (the `softmax_of_top_k_router` kind).
class ReplayableSoftmaxOfTopKRouter : public Replayable<torchpatch::nn::SoftmaxOfTopKRouter> {
 public:
  explicit ReplayableSoftmaxOfTopKRouter(const torchpatch::BuildContext& ctx)
      : Replayable(torchpatch::router_options(torchpatch::model_config(ctx).decoder)) {}

 protected:
  at::Tensor logits(const at::Tensor& hidden) override { return at::linear(hidden, weight, bias); }
  at::Tensor weights_for(const at::Tensor& logits, const at::Tensor& indices) override {
    return torchpatch::nn::softmax_of_top_k_scores_for(logits, indices);
  }
};

void register_plugin(torchpatch::Registrar& registrar) {
  using torchpatch::PatchMapping;
  const torchpatch::DeviceTypes kDevices{c10::kCPU, c10::kCUDA};  // LibTorch's operations only
  registrar.add_replacement<ReplayableTopKRouter>("ReplayableTopKRouter",
                                                  {PatchMapping::kind_key(torchpatch::block_kind::kRouter)}, kDevices);
  registrar.add_replacement<ReplayableGroupedTopKRouter>("ReplayableGroupedTopKRouter",
                                                         {PatchMapping::kind_key(torchpatch::block_kind::kGroupedRouter)}, kDevices);
  registrar.add_replacement<ReplayableSoftmaxOfTopKRouter>(
      "ReplayableSoftmaxOfTopKRouter", {PatchMapping::kind_key(torchpatch::block_kind::kSoftmaxOfTopKRouter)}, kDevices);
}

}  // namespace

TORCHPATCH_PLUGIN("replayable-router", "1.0.0", register_plugin)
