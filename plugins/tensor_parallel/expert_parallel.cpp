// Expert parallelism for the MoE families (those whose parallel plan has the `experts` and
// `sparse_block` styles): rank r of N holds experts
// [r*E/N, (r+1)*E/N), the router runs on every rank (its inputs are the same bits everywhere, so
// are its choices), each rank runs its experts' share of the chosen pairs, the shared expert is split
// like the MLP, and one all-reduce per block sums both:
//
//   out = Σ_r experts_r(x) + sigmoid(shared_expert_gate(x)) * Σ_r shared_expert_r(x)   (one all-reduce;
//   a family without the gate adds the shared expert as it is)
//
// Each rank reads only its experts from the checkpoint (SelectExperts runs before the stacking), and
// saving gathers them back in expert order.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "parallel.h"
#include "torchpatch/models/family.h"

namespace torchpatch_tensor_parallel {

namespace {

// -- conversion ops -------------------------------------------------------------------------------------

// The experts a rank holds: [first, first + count) of the `total` per-expert tensors of each source
// pattern (they arrive in expert order), kept before anything stacks them.
struct ExpertShare {
  int64_t first = 0, count = 0, total = 0;
};

ExpertShare share_of(int64_t total, const std::shared_ptr<ProcessGroup>& group) {
  const int64_t count = total / world_of(group);
  return {group ? group->rank() * count : 0, count, total};
}

class GatherExpertsOp;

class SelectExpertsOp : public checkpoint::ConversionOp {
 public:
  SelectExpertsOp(ExpertShare share, std::shared_ptr<ProcessGroup> group) : share_(share), group_(std::move(group)) {}
  std::string name() const override {
    return fmt::format("SelectExperts({}..{} of {})", share_.first, share_.first + share_.count - 1, share_.total);
  }
  checkpoint::PatternTensors convert(checkpoint::PatternTensors inputs, const std::vector<std::string>&,
                                     const std::vector<std::string>& targets) const override {
    for (auto& [pattern, tensors] : inputs) {
      if (static_cast<int64_t>(tensors.size()) != share_.total) {
        throw CheckpointError(fmt::format("{}: the checkpoint has {} tensors '{}', the config {} experts",
                                          targets.at(0), tensors.size(), pattern, share_.total));
      }
      tensors = {tensors.begin() + share_.first, tensors.begin() + share_.first + share_.count};
    }
    return inputs;
  }
  std::shared_ptr<checkpoint::ConversionOp> reverse() const override;

 private:
  ExpertShare share_;
  std::shared_ptr<ProcessGroup> group_;
};

// Every rank's experts, gathered in rank order (a collective: every rank saves).
class GatherExpertsOp : public checkpoint::ConversionOp {
 public:
  GatherExpertsOp(ExpertShare share, std::shared_ptr<ProcessGroup> group) : share_(share), group_(std::move(group)) {}
  std::string name() const override { return fmt::format("GatherExperts({} experts)", share_.total); }
  checkpoint::PatternTensors convert(checkpoint::PatternTensors inputs, const std::vector<std::string>&,
                                     const std::vector<std::string>&) const override {
    for (auto& [pattern, tensors] : inputs) {
      auto all = at::cat(group_->all_gather(at::stack(tensors).contiguous()), 0);  // [E, ...]
      tensors = all.unbind(0);
    }
    return inputs;
  }
  std::shared_ptr<checkpoint::ConversionOp> reverse() const override {
    return std::make_shared<SelectExpertsOp>(share_, group_);
  }

 private:
  ExpertShare share_;
  std::shared_ptr<ProcessGroup> group_;
};

std::shared_ptr<checkpoint::ConversionOp> SelectExpertsOp::reverse() const {
  return std::make_shared<GatherExpertsOp>(share_, group_);
}

// The families' expert rules (hub per-expert weights stacked into gate_up_proj / down_proj), with
// this rank's experts selected first.
checkpoint::ConversionRules experts_rules(const torchpatch::Config& config) {
  using namespace checkpoint;
  const auto group = torchpatch::dist::active_group();
  std::vector<OpPtr> select;
  if (group) {
    const auto total = config.as<torchpatch::ModelConfig>().decoder.moe.num_experts;
    select.push_back(std::make_shared<SelectExpertsOp>(share_of(total, group), group));
  }
  auto with_select = [&](std::vector<OpPtr> ops) {
    ops.insert(ops.begin(), select.begin(), select.end());
    return ops;
  };
  // The family's per-expert hub names (its experts layout: Mixtral's w1/w3/w2).
  const auto& layout = torchpatch::experts_layout(config.as<torchpatch::ModelConfig>());
  const auto expert = [](const std::string& proj) { return "*." + proj + ".weight"; };
  return {WeightConverter{{expert(layout.gate), expert(layout.up)},
                          {"gate_up_proj"},
                          with_select({MergeModulelist(0), Concatenate(1)})},
          WeightConverter{{expert(layout.down)}, {"down_proj"}, with_select({MergeModulelist(0)})}};
}

// -- experts --------------------------------------------------------------------------------------------

torchpatch::nn::ExpertsOptions local_experts(const BuildContext& ctx, const std::shared_ptr<ProcessGroup>& group) {
  auto options = torchpatch::experts_options(torchpatch::model_config(ctx).decoder);
  const int64_t n = world_of(group);
  if (options.num_experts % n != 0) {
    throw ConfigError(fmt::format("{}: {} experts do not split over {} ranks", ctx.path, options.num_experts, n));
  }
  options.num_experts /= n;
  return options;
}

/// This rank's experts (gate_up_proj [E/N, 2*Im, H], down_proj [E/N, H, Im]). Takes global expert ids;
/// the choices of other ranks' experts add nothing here. Its output is all-reduced, unless the
/// expert-parallel block around it reduces it together with the shared expert's.
class ExpertParallelExperts : public torchpatch::nn::FusedExperts {
 public:
  explicit ExpertParallelExperts(const BuildContext& ctx)
      : ExpertParallelExperts(ctx, torchpatch::dist::active_group()) {}

  /// The block will all-reduce this rank's share itself.
  void leave_reduction_to_block() { reduce_ = false; }

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights) override {
    const torchpatch::nn::ExpertProjections projections{
        [&](int64_t e, const at::Tensor& x) { return torchpatch::nn::linear(x, gate_up_proj[e]); },
        [&](int64_t e, const at::Tensor& x) { return torchpatch::nn::linear(x, down_proj[e]); },
        {},
        /*side_by_side=*/true};
    auto out = torchpatch::nn::grouped_experts(hidden, indices, weights, share_.total, {share_.first, share_.count},
                                               act, projections);
    if (at::GradMode::is_enabled() && !out.requires_grad() && (hidden.requires_grad() || weights.requires_grad())) {
      // No pair chose this rank's experts: keep the output on the inputs' graph anyway, so the backward
      // pass reaches their all-reduces (copy_to_ranks) on this rank as on the others.
      out = out + hidden * 0 + weights.sum(-1, /*keepdim=*/true) * 0;
    }
    if (reduce_) {
      out = out.contiguous();
      all_reduce(group_, out);
    }
    return out;
  }
  int64_t expert_count() const override { return share_.total; }  // ids are global

 private:
  ExpertParallelExperts(const BuildContext& ctx, std::shared_ptr<ProcessGroup> group)
      : FusedExperts(local_experts(ctx, group)),
        share_(share_of(torchpatch::model_config(ctx).decoder.moe.num_experts, group)),
        group_(std::move(group)) {}
  ExpertShare share_;
  std::shared_ptr<ProcessGroup> group_;
  bool reduce_ = true;
};

// -- the sparse block -----------------------------------------------------------------------------------

// The family's decoder classes, which the block builds its router, experts and shared expert from.
const torchpatch::DecoderSpec& family_classes(const BuildContext& ctx) {
  const auto& family = torchpatch::model_config(ctx).family;
  if (!family || !family->decoder) {
    throw ConfigError(fmt::format("{}: the config names no decoder family to build the expert-parallel block from",
                                  ctx.path));
  }
  return *family->decoder;
}

/// A family's sparse MoE block (built from its classes) whose output is reduced once over the group:
/// the routed experts' and the shared expert's partial sums together. A part another replacement
/// made whole is added after the all-reduce, on every rank.
class ExpertParallelBlock : public torchpatch::SparseMoeBlock {
  using Block = torchpatch::SparseMoeBlock;

 public:
  explicit ExpertParallelBlock(const BuildContext& ctx)
      : Block(ctx, family_classes(ctx)),
        group_(torchpatch::dist::active_group()),
        split_experts_(dynamic_cast<ExpertParallelExperts*>(this->experts.get())),
        split_shared_(dynamic_cast<TensorParallelMLP*>(this->shared_expert.get())) {
    if (split_experts_) split_experts_->leave_reduction_to_block();
  }

  at::Tensor forward(const at::Tensor& hidden) override {
    if (!group_) return Block::forward(hidden);
    const auto shape = hidden.sizes().vec();
    const auto x = hidden.reshape({-1, shape.back()});  // [T, H]
    const auto routed = this->gate->forward(x);         // the same on every rank
    // [T, 1]: the shared expert's gate, or 1 where the family has none (GLM-4.5, DeepSeek-V3)
    const auto scale = !this->shared_expert       ? at::Tensor()
                       : this->shared_expert_gate ? at::sigmoid(this->shared_expert_gate->forward(x))
                                                  : at::ones({x.size(0), 1}, x.options());
    // Replicated tensors entering partial sums: their gradients are summed over the ranks.
    const auto partial_x = copy_to_ranks(x, group_);
    auto partial = split_experts_ ? this->experts->forward(partial_x, routed.indices, copy_to_ranks(routed.scores, group_))
                                  : at::zeros_like(x);
    if (split_shared_) partial = partial + copy_to_ranks(scale, group_) * split_shared_->forward_partial(partial_x);
    partial = partial.contiguous();
    group_->all_reduce_sum(partial);
    auto out = partial;
    if (!split_experts_) out = out + this->experts->forward(x, routed.indices, routed.scores);
    if (this->shared_expert && !split_shared_) out = out + scale * this->shared_expert->forward(x);
    return out.view(shape);
  }

 private:
  std::shared_ptr<ProcessGroup> group_;
  ExpertParallelExperts* split_experts_;  // null when another replacement holds the experts
  TensorParallelMLP* split_shared_;       // null without a shared expert, or when it is not split
};

}  // namespace

void register_expert_parallel(torchpatch::Registrar& registrar) {
  registrar.add_replacement(torchpatch::module_class<ExpertParallelExperts>("ExpertParallelExperts"), {});
  registrar.add_conversion("ExpertParallelExperts", experts_rules);
  registrar.add_replacement(torchpatch::module_class<ExpertParallelBlock>("ExpertParallelBlock"), {});
}

}  // namespace torchpatch_tensor_parallel
