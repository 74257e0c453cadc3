// What the tensor-parallel plugin's two halves share: the dense classes (tensor_parallel.cpp) and
// the expert-parallel MoE classes (expert_parallel.cpp), which reduce the shared expert's partial sums
// together with their experts'.
#pragma once

#include <memory>

#include <ATen/core/Tensor.h>

#include "torchpatch/dist/process_group.h"
#include "torchpatch/models/blocks.h"
#include "torchpatch/plugin_api.h"

namespace torchpatch_tensor_parallel {

using torchpatch::BuildContext;
using torchpatch::CheckpointError;
using torchpatch::ConfigError;
using torchpatch::dist::ProcessGroup;
namespace checkpoint = torchpatch::checkpoint;

/// The group's world size (1 without a group: the classes are then the plain ones).
int64_t world_of(const std::shared_ptr<ProcessGroup>& group);

/// Sums `partial` over the group in place (nothing without a group).
void all_reduce(const std::shared_ptr<ProcessGroup>& group, at::Tensor& partial);

/// `x` unchanged, but in a backward pass its gradient is summed over the group: what a replicated
/// tensor needs where it enters a rank's partial computation (Megatron's "f"; the all-reduce after
/// the partial sums, whose backward is the identity, is its "g"). Without gradients it is `x` itself.
at::Tensor copy_to_ranks(const at::Tensor& x, const std::shared_ptr<ProcessGroup>& group);

/// The gated MLP over this rank's slice of the intermediate dimension; down_proj's partial sums are
/// all-reduced.
class TensorParallelMLP : public torchpatch::nn::GatedMlp {
 public:
  explicit TensorParallelMLP(const BuildContext& ctx);

  at::Tensor forward(const at::Tensor& x) override;
  /// This rank's share of the output, before the all-reduce (a MoE block reduces it with its experts';
  /// `x` must have passed copy_to_ranks when gradients are wanted).
  at::Tensor forward_partial(const at::Tensor& x) { return GatedMlp::forward(x); }

 private:
  TensorParallelMLP(const BuildContext& ctx, std::shared_ptr<ProcessGroup> group);
  std::shared_ptr<ProcessGroup> group_;
};

/// Registers the expert-parallel classes: ExpertParallelExperts and the MoE families' blocks.
void register_expert_parallel(torchpatch::Registrar& registrar);

}  // namespace torchpatch_tensor_parallel
