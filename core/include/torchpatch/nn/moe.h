// Mixture-of-experts blocks of the Qwen MoE families: the top-k router, the experts with fused
// weights, and the sparse block that joins them (with an optional gated shared expert).
#pragma once

#include "torchpatch/export.h"

#include <memory>
#include <string>

#include "torchpatch/nn/linear.h"
#include "torchpatch/patching/roles.h"

namespace torchpatch::nn {

/// Softmax in float32 over router logits [T, E], top-k (most probable first), optional
/// renormalisation, weights cast back to the logits' dtype: Hugging Face's router arithmetic.
TORCHPATCH_API RouterOutput route_top_k(const at::Tensor& logits, int64_t top_k, bool norm_topk_prob);

/// Router weights recomputed for given expert choices: softmax(logits)[indices], renormalised like
/// route_top_k. Differentiable in `logits` (replaying recorded routes keeps gradients to the router).
TORCHPATCH_API at::Tensor scores_for(const at::Tensor& logits, const at::Tensor& indices, bool norm_topk_prob);

/// `XTopKRouter`: weight [E, H]; logits = hidden @ weight^T.
class TORCHPATCH_API TopKRouter : public roles::Router {
 public:
  explicit TopKRouter(const BuildContext& ctx);
  RouterOutput forward(const at::Tensor& hidden) override;

  at::Tensor weight;  ///< [E, H]
  int64_t top_k;
  int64_t num_experts;
  bool norm_topk_prob;
};

/// `XExperts`: every expert's gated MLP in two stacked parameters, gate_up_proj [E, 2*Im, H] (gate
/// rows first) and down_proj [E, H, Im]. Two ways to run, same numbers (same order of additions):
/// "eager", Hugging Face's loop that scans the choices once per expert, and "grouped" (default),
/// which sorts the token-expert pairs by expert once and runs each chosen expert on its slice.
class TORCHPATCH_API FusedExperts : public roles::Experts {
 public:
  explicit FusedExperts(const BuildContext& ctx);
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights) override;

  at::Tensor forward_eager(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights);
  at::Tensor forward_grouped(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights);

  at::Tensor gate_up_proj;  ///< [E, 2*Im, H]
  at::Tensor down_proj;     ///< [E, H, Im]
  int64_t num_experts;
  int64_t intermediate_dim;
  std::string hidden_act;
  std::string implementation;  ///< "grouped" or "eager"
};

/// Patch-point keys of a sparse block's parts.
struct TORCHPATCH_API SparseMoeKeys {
  std::string router;         ///< e.g. "Qwen2MoeTopKRouter"
  std::string experts;        ///< e.g. "Qwen2MoeExperts"
  std::string shared_expert;  ///< e.g. "Qwen2MoeMLP"; "" = no shared expert (Qwen3-MoE)
};

/// `XSparseMoeBlock` (fills an MLP slot): route, run the chosen experts, add the shared expert
/// scaled by sigmoid(shared_expert_gate(x)). Reports its router's and experts' outputs to output capture.
class TORCHPATCH_API SparseMoeBlock : public roles::Mlp {
 public:
  SparseMoeBlock(const BuildContext& ctx, const SparseMoeKeys& keys);
  at::Tensor forward(const at::Tensor& hidden) override;

  std::shared_ptr<roles::Router> gate;
  std::shared_ptr<roles::Experts> experts;
  std::shared_ptr<roles::Mlp> shared_expert;     ///< null without a shared expert
  std::shared_ptr<Linear> shared_expert_gate;    ///< [1, H]; null without a shared expert
};

}  // namespace torchpatch::nn
