#include "torchpatch/nn/moe.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <fmt/format.h>

#include "torchpatch/error.h"

namespace torchpatch::nn {

namespace {
at::Tensor new_weight(at::IntArrayRef sizes, int64_t fan_in) {
  return new_parameter(sizes, /*is_bias=*/false, 1.0 / std::sqrt(static_cast<double>(fan_in)));
}
}  // namespace

RouterOutput route_top_k(const at::Tensor& logits, int64_t top_k, bool norm_topk_prob) {
  auto probs = at::softmax(logits, -1, reduction_type(logits.scalar_type()));  // [T, E]
  auto [top, indices] = probs.topk(top_k, -1);       // sorted, most probable first
  if (norm_topk_prob) top = top / top.sum(-1, /*keepdim=*/true);
  return {logits, top.to(logits.scalar_type()), indices};
}

at::Tensor scores_for(const at::Tensor& logits, const at::Tensor& indices, bool norm_topk_prob) {
  auto top = at::softmax(logits, -1, reduction_type(logits.scalar_type())).gather(-1, indices.to(at::kLong));
  if (norm_topk_prob) top = top / top.sum(-1, /*keepdim=*/true);
  return top.to(logits.scalar_type());
}

// Router ----------------------------------------------------------------------------------------

TopKRouter::TopKRouter(const RouterOptions& o)
    : top_k(o.top_k), num_experts(o.num_experts), norm_topk_prob(o.norm_topk_prob) {
  weight = register_parameter("weight", new_weight({num_experts, o.hidden_size}, o.hidden_size));
}

RouterOutput TopKRouter::forward_impl(const at::Tensor& hidden) {
  return route_top_k(nn::linear(hidden, weight), top_k, norm_topk_prob);  // logits [T, E]
}

at::Tensor grouped_scores_for(const at::Tensor& logits, const at::Tensor& indices, bool norm_topk_prob, double scaling) {
  auto top = at::sigmoid(logits.to(at::kFloat)).gather(-1, indices.to(at::kLong));
  if (norm_topk_prob) top = top / (top.sum(-1, /*keepdim=*/true) + 1e-20);
  return top * scaling;
}

GroupedTopKRouter::GroupedTopKRouter(const GroupedRouterOptions& o) : options(o) {
  weight = register_parameter("weight", new_weight({o.num_experts, o.hidden_size}, o.hidden_size));
  e_score_correction_bias =
      register_parameter("e_score_correction_bias", at::zeros({o.num_experts}, at::kFloat), /*requires_grad=*/false);
}

RouterOutput GroupedTopKRouter::forward_impl(const at::Tensor& hidden) {
  const auto& o = options;
  const auto logits = at::linear(hidden.to(at::kFloat), weight.to(at::kFloat));  // [T, E]
  at::Tensor indices;
  {
    at::NoGradGuard no_grad;  // choosing is not differentiable; the weights below are
    const auto choice = at::sigmoid(logits) + e_score_correction_bias;
    const auto per_group = o.num_experts / o.n_group;
    const auto group_scores = std::get<0>(choice.view({-1, o.n_group, per_group}).topk(2, -1)).sum(-1);  // [T, G]
    const auto groups = std::get<1>(group_scores.topk(o.topk_group, -1, /*largest=*/true, /*sorted=*/false));
    const auto group_mask = at::zeros_like(group_scores).scatter_(1, groups, 1.0);
    const auto expert_mask = group_mask.unsqueeze(-1).expand({-1, o.n_group, per_group}).reshape({-1, o.num_experts});
    const auto candidates = choice.masked_fill(expert_mask.logical_not(), 0.0);
    indices = std::get<1>(candidates.topk(o.top_k, -1, /*largest=*/true, /*sorted=*/false));
  }
  return {logits, grouped_scores_for(logits, indices, o.norm_topk_prob, o.routed_scaling_factor), indices};
}

SoftmaxOfTopKRouter::SoftmaxOfTopKRouter(const RouterOptions& o) : top_k(o.top_k) {
  weight = register_parameter("weight", new_weight({o.num_experts, o.hidden_size}, o.hidden_size));
  bias = register_parameter("bias", at::zeros({o.num_experts}));
}

at::Tensor softmax_of_top_k_scores_for(const at::Tensor& logits, const at::Tensor& indices) {
  return at::softmax(logits.gather(-1, indices.to(at::kLong)), -1, logits.scalar_type());
}

RouterOutput SoftmaxOfTopKRouter::forward_impl(const at::Tensor& hidden) {
  const auto logits = at::linear(hidden, weight, bias);  // [T, E]
  const auto top = logits.topk(top_k, -1);              // largest first
  return {logits, at::softmax(std::get<0>(top), -1, logits.scalar_type()), std::get<1>(top)};
}

// Experts ---------------------------------------------------------------------------------------

FusedExperts::FusedExperts(const ExpertsOptions& o)
    : num_experts(o.num_experts), intermediate_dim(o.intermediate_size), act(o.act), implementation(o.implementation) {
  const auto h = o.hidden_size;
  gate_up_proj = register_parameter("gate_up_proj", new_weight({num_experts, 2 * intermediate_dim, h}, h));
  down_proj = register_parameter("down_proj", new_weight({num_experts, h, intermediate_dim}, intermediate_dim));
}

at::Tensor FusedExperts::forward_impl(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights) {
  return implementation == ExpertsImplementation::kEager ? forward_eager(hidden, indices, weights)
                                                         : forward_grouped(hidden, indices, weights);
}

at::Tensor FusedExperts::forward_eager(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights) {
  auto out = at::zeros_like(hidden);  // [T, H]
  for (int64_t e = 0; e < num_experts; ++e) {
    auto hits = (indices == e).nonzero();  // [n, 2] (token, slot)
    if (hits.size(0) == 0) continue;
    auto token = hits.select(1, 0), slot = hits.select(1, 1);
    auto x = hidden.index_select(0, token);
    auto gate_up = nn::linear(x, gate_up_proj[e]).chunk(2, -1);
    auto y = nn::linear(activate(act, gate_up[0]) * gate_up[1], down_proj[e]);
    y = y * weights.index({token, slot}).unsqueeze(-1);
    out.index_add_(0, token, y.to(out.scalar_type()));
  }
  return out;
}

at::Tensor FusedExperts::forward_grouped(const at::Tensor& hidden, const at::Tensor& indices,
                                         const at::Tensor& weights) {
  const ExpertProjections projections{[&](int64_t e, const at::Tensor& x) { return nn::linear(x, gate_up_proj[e]); },
                                      [&](int64_t e, const at::Tensor& x) { return nn::linear(x, down_proj[e]); },
                                      {},
                                      /*side_by_side=*/true};
  return grouped_experts(hidden, indices, weights, num_experts, act, projections);
}

namespace {

// The down projection's input from the gate_up projection's output.
at::Tensor gated(Activation act, const ExpertProjections& projections, const at::Tensor& gate_up) {
  if (projections.glu) return projections.glu(gate_up);
  const auto halves = gate_up.chunk(2, -1);
  return activate(act, halves[0]) * halves[1];
}

// One token (decoding at batch 1): its chosen experts in ascending order, each on the token's row as
// it is. The same additions in the same order as the grouped loop's scatter (into zeros, so even the
// sign of a zero agrees), without the sort, bincount, gathers and scatter, whose dispatch costs more
// than the products of small experts. Returns an undefined tensor when the grouped loop must decide:
// an expert chosen twice (it runs once on two rows there, with another product's rounding) or an id
// out of range (its error is the grouped loop's).
at::Tensor one_token_experts(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights,
                             int64_t num_experts, ExpertRange range, Activation act,
                             const ExpertProjections& projections) {
  const auto ids = indices.to(at::kCPU, at::kLong).contiguous();
  const auto* id = ids.data_ptr<int64_t>();
  std::vector<int64_t> slots(static_cast<std::size_t>(ids.numel()));
  for (std::size_t k = 0; k < slots.size(); ++k) slots[k] = static_cast<int64_t>(k);
  std::stable_sort(slots.begin(), slots.end(), [&](int64_t a, int64_t b) { return id[a] < id[b]; });
  for (std::size_t k = 0; k < slots.size(); ++k) {
    const auto e = id[slots[k]];
    if (e < 0 || e >= num_experts || (k > 0 && e == id[slots[k - 1]])) return {};
  }
  auto out = at::zeros_like(hidden);
  for (const auto slot : slots) {
    const auto local = id[slot] - range.first;
    if (local < 0 || local >= range.count) continue;
    auto y = projections.down(local, gated(act, projections, projections.gate_up(local, hidden))) *
             weights.select(1, slot).unsqueeze(-1);
    out.add_(y.to(out.scalar_type()));
  }
  return out;
}

// run(l) for every chosen expert. A prompt's tokens spread over the experts make products of a few
// rows each, too small to split across threads well: qwen2-moe-125m's 128-token prefill ran 1.35x
// faster on two threads than on one, a third of its time in OpenMP's barriers and the BLAS packing
// each small product's weights. So on the CPU, without gradients, the experts run side by side on
// OpenMP's threads, where a BLAS call runs on one thread, taking the next expert of `chosen` as one
// finishes (the caller lists the busiest first); the results are added afterwards in expert order.
void run_experts(const at::Tensor& hidden, const std::vector<int64_t>& chosen, bool side_by_side,
                 const std::function<void(int64_t)>& run) {
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(chosen.size()));
  if (!side_by_side || threads < 2 || !hidden.is_cpu() || at::GradMode::is_enabled() || at::in_parallel_region()) {
    for (const auto l : chosen) run(l);
    return;
  }
  std::atomic<std::size_t> next{0};
  const at::ThreadLocalState state;  // no-grad and inference mode are per thread: the workers take the caller's
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    const at::ThreadLocalStateGuard guard(state);
    for (std::size_t i; (i = next.fetch_add(1)) < chosen.size();) run(chosen[i]);
  });
}

}  // namespace

at::Tensor grouped_experts(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights,
                           int64_t num_experts, Activation act, const ExpertProjections& projections) {
  return grouped_experts(hidden, indices, weights, num_experts, ExpertRange{0, num_experts}, act, projections);
}

at::Tensor grouped_experts(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights,
                           int64_t num_experts, ExpertRange range, Activation act,
                           const ExpertProjections& projections) {
  if (hidden.dim() == 2 && hidden.size(0) == 1 && !at::GradMode::is_enabled()) {
    auto out = one_token_experts(hidden, indices, weights, num_experts, range, act, projections);
    if (out.defined()) return out;
  }
  const int64_t top_k = indices.size(1);
  // Token-expert pairs sorted by expert (stable: tokens stay in order within an expert), so each
  // chosen expert reads one contiguous slice of gathered tokens; the range's pairs are one run of them.
  const auto flat = indices.reshape({-1});
  const auto counts = at::bincount(flat, {}, num_experts).cpu().contiguous();  // fails on a negative id
  if (counts.size(0) > num_experts) {
    throw InputError(fmt::format("expert id {} is out of range for {} experts", counts.size(0) - 1, num_experts));
  }
  const auto* count = counts.data_ptr<int64_t>();
  int64_t before = 0, inside = 0;
  for (int64_t e = 0; e < range.first; ++e) before += count[e];
  for (int64_t e = range.first; e < range.first + range.count; ++e) inside += count[e];
  auto out = at::zeros_like(hidden);
  if (inside == 0) return out;
  const auto order = std::get<1>(flat.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false)).narrow(0, before, inside);
  const auto token = order.div(top_k, "floor");
  const auto x = hidden.index_select(0, token);  // [n, H], grouped by expert
  const auto w = weights.reshape({-1}).index_select(0, order).unsqueeze(-1);
  std::vector<int64_t> start(static_cast<std::size_t>(range.count) + 1, 0), chosen;
  for (int64_t l = 0; l < range.count; ++l) {
    start[l + 1] = start[l] + count[range.first + l];
    if (count[range.first + l] > 0) chosen.push_back(l);
  }
  std::vector<at::Tensor> ys(static_cast<std::size_t>(range.count));
  auto busiest_first = chosen;
  std::stable_sort(busiest_first.begin(), busiest_first.end(),
                   [&](int64_t a, int64_t b) { return start[a + 1] - start[a] > start[b + 1] - start[b]; });
  run_experts(hidden, busiest_first, projections.side_by_side, [&](int64_t l) {
    const auto slice = x.narrow(0, start[l], start[l + 1] - start[l]);
    ys[l] = projections.down(l, gated(act, projections, projections.gate_up(l, slice))) *
            w.narrow(0, start[l], start[l + 1] - start[l]);
  });
  for (const auto l : chosen) {
    // A scatter per expert, in ascending order, as the eager loop does: in half precision each
    // expert's addition rounds on its own there (one scatter of them all accumulates in float32 in
    // LibTorch 2.x, and would differ in the last bit).
    out.index_add_(0, token.narrow(0, start[l], start[l + 1] - start[l]), ys[l].to(out.scalar_type()));
  }
  return out;
}

at::Tensor clamped_swiglu(const at::Tensor& gate_up, double limit, double alpha) {
  const auto gate = gate_up.slice(-1, 0, c10::nullopt, 2).clamp_max(limit);
  const auto up = gate_up.slice(-1, 1, c10::nullopt, 2).clamp(-limit, limit);
  return (up + 1) * (gate * at::sigmoid(gate * alpha));
}

ClampedSwigluExperts::ClampedSwigluExperts(const ClampedSwigluExpertsOptions& o) : options(o) {
  const auto e = o.num_experts, h = o.hidden_size, i = o.intermediate_size;
  gate_up_proj = register_parameter("gate_up_proj", new_weight({e, h, 2 * i}, h));
  gate_up_proj_bias = register_parameter("gate_up_proj_bias", new_parameter({e, 2 * i}, /*is_bias=*/true));
  down_proj = register_parameter("down_proj", new_weight({e, i, h}, i));
  down_proj_bias = register_parameter("down_proj_bias", new_parameter({e, h}, /*is_bias=*/true));
}

at::Tensor ClampedSwigluExperts::forward_impl(const at::Tensor& hidden, const at::Tensor& indices,
                                              const at::Tensor& weights) {
  const ExpertProjections projections{
      [&](int64_t e, const at::Tensor& x) { return at::addmm(gate_up_proj_bias[e], x, gate_up_proj[e]); },
      [&](int64_t e, const at::Tensor& x) { return at::addmm(down_proj_bias[e], x, down_proj[e]); },
      [&](const at::Tensor& gate_up) { return clamped_swiglu(gate_up, options.limit, options.alpha); },
      /*side_by_side=*/true};
  return grouped_experts(hidden, indices, weights, options.num_experts, Activation::kSilu, projections);
}

}  // namespace torchpatch::nn
