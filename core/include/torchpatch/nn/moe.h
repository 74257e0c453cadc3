// Mixture-of-experts blocks of the Qwen MoE families: the top-k router and the experts with fused
// weights (the sparse block that joins them is models/blocks.h).
#pragma once

#include <functional>

#include "torchpatch/export.h"

#include <memory>
#include <string>

#include "torchpatch/nn/linear.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/patching/roles.h"

namespace torchpatch::nn {

/// Softmax in float32 over router logits [T, E], top-k (most probable first), optional
/// renormalisation, weights cast back to the logits' dtype: Hugging Face's router arithmetic.
TORCHPATCH_API RouterOutput route_top_k(const at::Tensor& logits, int64_t top_k, bool norm_topk_prob);

/// Router weights recomputed for given expert choices: softmax(logits)[indices], renormalised like
/// route_top_k. Differentiable in `logits` (replaying recorded routes keeps gradients to the router).
TORCHPATCH_API at::Tensor scores_for(const at::Tensor& logits, const at::Tensor& indices, bool norm_topk_prob);

struct TORCHPATCH_API RouterOptions {
  int64_t hidden_size = 0;
  int64_t num_experts = 0;
  int64_t top_k = 0;
  bool norm_topk_prob = false;
};

struct TORCHPATCH_API GroupedRouterOptions {
  int64_t hidden_size = 0;
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t n_group = 1;     ///< experts in this many equal groups
  int64_t topk_group = 1;  ///< groups searched: those with the best two-expert score sums
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
};

/// Router weights for given expert choices under the DeepSeek-style rule: sigmoid(logits)[indices],
/// renormalised when `norm_topk_prob`, times `scaling`. Differentiable in `logits`.
TORCHPATCH_API at::Tensor grouped_scores_for(const at::Tensor& logits, const at::Tensor& indices, bool norm_topk_prob,
                                             double scaling);

/// The DeepSeek-V3 / GLM-4.5 router: weight [E, H] and e_score_correction_bias [E] (float32, not
/// trained). Logits in float32; sigmoid scores; the bias steers the choice (group ranking and top-k)
/// but not the weights, which are the chosen sigmoid scores, renormalised and scaled. Indices in
/// the order LibTorch's unsorted top-k gives them, as Hugging Face's.
class TORCHPATCH_API GroupedTopKRouter : public roles::Router {
 public:
  explicit GroupedTopKRouter(const GroupedRouterOptions& options);

  at::Tensor weight;                   ///< [E, H]
  at::Tensor e_score_correction_bias;  ///< [E], float32
  GroupedRouterOptions options;

 protected:
  RouterOutput forward_impl(const at::Tensor& hidden) override;
};

/// GPT-OSS's router: weight [E, H] and bias [E]; the k largest logits (largest first), then a softmax
/// over those k alone.
class TORCHPATCH_API SoftmaxOfTopKRouter : public roles::Router {
 public:
  explicit SoftmaxOfTopKRouter(const RouterOptions& options);

  at::Tensor weight;  ///< [E, H]
  at::Tensor bias;    ///< [E]
  int64_t top_k;

 protected:
  RouterOutput forward_impl(const at::Tensor& hidden) override;
};

/// SoftmaxOfTopKRouter's weights for given expert choices: a softmax over logits[indices].
TORCHPATCH_API at::Tensor softmax_of_top_k_scores_for(const at::Tensor& logits, const at::Tensor& indices);

/// `XTopKRouter`: weight [E, H]; logits = hidden @ weight^T.
class TORCHPATCH_API TopKRouter : public roles::Router {
 public:
  explicit TopKRouter(const RouterOptions& options);

  at::Tensor weight;  ///< [E, H]
  int64_t top_k;
  int64_t num_experts;
  bool norm_topk_prob;

 protected:
  RouterOutput forward_impl(const at::Tensor& hidden) override;
};

/// How the built-in experts run (the same numbers either way).
enum class ExpertsImplementation {
  kGrouped,  ///< tokens gathered per chosen expert (the default)
  kEager     ///< Hugging Face's reference loop over experts
};

struct TORCHPATCH_API ExpertsOptions {
  int64_t hidden_size = 0;
  int64_t num_experts = 0;
  int64_t intermediate_size = 0;  ///< each expert's width
  Activation act = Activation::kSilu;
  ExpertsImplementation implementation = ExpertsImplementation::kGrouped;
};

/// One expert's projections for `grouped_experts`: gate_up(e, x [n, H]) -> [n, 2*Im] (gate columns
/// first), down(e, x [n, Im]) -> [n, H]. How the weights are held is the caller's (float, quantized).
struct TORCHPATCH_API ExpertProjections {
  std::function<at::Tensor(int64_t expert, const at::Tensor& x)> gate_up;
  std::function<at::Tensor(int64_t expert, const at::Tensor& x)> down;
  /// gate_up's output [n, 2*Im] -> down's input [n, Im]; when empty, act(first half) * second half.
  std::function<at::Tensor(const at::Tensor& gate_up)> glu = {};
  /// Whether a prompt's experts may run side by side on LibTorch's (OpenMP) threads, each product on
  /// one of them, so gate_up, down and glu are called from several threads at once. Worth it for the
  /// BLAS's float products (core's experts opt in); not for the quantized kernels, which split each
  /// product over torchpatch's own thread team (tried side by side there: prefill 1.5-2x slower).
  bool side_by_side = false;
};

/// The grouped experts loop: token-expert pairs sorted by expert once, each chosen expert's gated MLP
/// run on its slice, the results weighted and added per token in ascending expert order (the
/// numbers of Hugging Face's eager loop). hidden [T, H], indices/weights [T, K] -> [T, H]. One token
/// without gradients (a decode step) skips the grouping: its experts run directly, with the same
/// numbers bit for bit.
TORCHPATCH_API at::Tensor grouped_experts(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights,
                                          int64_t num_experts, Activation act, const ExpertProjections& projections);

/// Experts [first, first + count) of `num_experts`: the ones one process holds under expert
/// parallelism. `indices` are global ids; `projections` get local ids (expert - first); choices of
/// other experts contribute nothing. The range (0, num_experts) is grouped_experts.
struct TORCHPATCH_API ExpertRange {
  int64_t first = 0;
  int64_t count = 0;
};
TORCHPATCH_API at::Tensor grouped_experts(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights,
                                          int64_t num_experts, ExpertRange range, Activation act,
                                          const ExpertProjections& projections);

/// `XExperts`: every expert's gated MLP in two stacked parameters, gate_up_proj [E, 2*Im, H] (gate
/// rows first) and down_proj [E, H, Im]. Two ways to run, same numbers (same order of additions):
/// "eager", Hugging Face's loop that scans the choices once per expert, and "grouped" (default),
/// which sorts the token-expert pairs by expert once and runs each chosen expert on its slice.
class TORCHPATCH_API FusedExperts : public roles::Experts {
 public:
  explicit FusedExperts(const ExpertsOptions& options);

  at::Tensor forward_eager(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights);
  at::Tensor forward_grouped(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights);

  at::Tensor gate_up_proj;  ///< [E, 2*Im, H]
  at::Tensor down_proj;     ///< [E, H, Im]
  int64_t num_experts;
  int64_t intermediate_dim;
  Activation act;
  ExpertsImplementation implementation;

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights) override;
  int64_t expert_count() const override { return num_experts; }
};

struct TORCHPATCH_API ClampedSwigluExpertsOptions {
  int64_t hidden_size = 0;
  int64_t num_experts = 0;
  int64_t intermediate_size = 0;  ///< each expert's width
  double limit = 7.0;             ///< gate clamped above, up on both sides
  double alpha = 1.702;           ///< the sigmoid's slope
};

/// GPT-OSS's gated activation of gate_up [n, 2*Im], gate and up interleaved (gate in the even
/// columns): (up + 1) * gate * sigmoid(alpha * gate), gate clamped to at most `limit` and up to
/// [-limit, limit] first.
TORCHPATCH_API at::Tensor clamped_swiglu(const at::Tensor& gate_up, double limit, double alpha);

/// GPT-OSS's experts, held as the hub has them: gate_up_proj [E, H, 2*Im] (input rows, gate and up
/// interleaved by column) with gate_up_proj_bias [E, 2*Im], down_proj [E, Im, H] with down_proj_bias
/// [E, H], and the clamped SwiGLU between them. Run by the grouped loop (each token's experts added
/// in ascending order, as Hugging Face's loop adds them).
class TORCHPATCH_API ClampedSwigluExperts : public roles::Experts {
 public:
  explicit ClampedSwigluExperts(const ClampedSwigluExpertsOptions& options);

  at::Tensor gate_up_proj;       ///< [E, H, 2*Im]
  at::Tensor gate_up_proj_bias;  ///< [E, 2*Im]
  at::Tensor down_proj;          ///< [E, Im, H]
  at::Tensor down_proj_bias;     ///< [E, H]
  ClampedSwigluExpertsOptions options;

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights) override;
  int64_t expert_count() const override { return options.num_experts; }
};

}  // namespace torchpatch::nn
