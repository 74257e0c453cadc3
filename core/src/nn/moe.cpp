#include "torchpatch/nn/moe.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/models/config.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/patching/build.h"
#include "torchpatch/patching/outputs.h"

namespace torchpatch::nn {

namespace {
at::Tensor new_weight(at::IntArrayRef sizes, int64_t fan_in) {
  auto t = at::empty(sizes);
  if (!SkipInit::active()) init_parameter(t, false, false, 1.0 / std::sqrt(static_cast<double>(fan_in)));
  return t;
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

TopKRouter::TopKRouter(const BuildContext& ctx)
    : top_k(ctx.config.decoder.moe.num_experts_per_tok),
      num_experts(ctx.config.decoder.moe.num_experts),
      norm_topk_prob(ctx.config.decoder.moe.norm_topk_prob) {
  const auto h = ctx.config.decoder.hidden_size;
  weight = register_parameter("weight", new_weight({num_experts, h}, h));
}

RouterOutput TopKRouter::forward(const at::Tensor& hidden) {
  return route_top_k(nn::linear(hidden, weight), top_k, norm_topk_prob);  // logits [T, E]
}

// Experts ---------------------------------------------------------------------------------------

FusedExperts::FusedExperts(const BuildContext& ctx)
    : num_experts(ctx.config.decoder.moe.num_experts),
      intermediate_dim(ctx.config.decoder.moe.moe_intermediate_size),
      hidden_act(ctx.config.decoder.hidden_act),
      implementation(ctx.config.decoder.moe.experts_implementation) {
  const auto h = ctx.config.decoder.hidden_size;
  gate_up_proj = register_parameter("gate_up_proj", new_weight({num_experts, 2 * intermediate_dim, h}, h));
  down_proj = register_parameter("down_proj", new_weight({num_experts, h, intermediate_dim}, intermediate_dim));
}

at::Tensor FusedExperts::forward(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights) {
  if (indices.dim() != 2 || indices.size(0) != hidden.size(0) || weights.sizes() != indices.sizes()) {
    throw InputError(fmt::format("experts: indices {} and weights {} must both be [tokens {}, top_k]",
                                 fmt::join(indices.sizes(), "x"), fmt::join(weights.sizes(), "x"), hidden.size(0)));
  }
  if (indices.numel() > 0 && (indices.min().item<int64_t>() < 0 || indices.max().item<int64_t>() >= num_experts)) {
    throw InputError(fmt::format("experts: an expert index is outside 0..{}", num_experts - 1));
  }
  return implementation == "eager" ? forward_eager(hidden, indices, weights)
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
    auto y = nn::linear(activation(hidden_act, gate_up[0]) * gate_up[1], down_proj[e]);
    y = y * weights.index({token, slot}).unsqueeze(-1);
    out.index_add_(0, token, y.to(out.scalar_type()));
  }
  return out;
}

at::Tensor FusedExperts::forward_grouped(const at::Tensor& hidden, const at::Tensor& indices,
                                         const at::Tensor& weights) {
  const int64_t top_k = indices.size(1);
  // Token-expert pairs sorted by expert (stable: tokens stay in order within an expert), so each
  // chosen expert reads one contiguous slice of gathered tokens.
  const auto flat = indices.reshape({-1});
  const auto order = std::get<1>(flat.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
  const auto token = order.div(top_k, "floor");
  const auto counts = at::bincount(flat, {}, num_experts).contiguous();
  const auto* count = counts.data_ptr<int64_t>();
  const auto x = hidden.index_select(0, token);  // [T*K, H], grouped by expert
  const auto w = weights.reshape({-1}).index_select(0, order).unsqueeze(-1);
  std::vector<at::Tensor> pieces;
  int64_t start = 0;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (count[e] == 0) continue;
    auto slice = x.narrow(0, start, count[e]);
    auto gate_up = nn::linear(slice, gate_up_proj[e]).chunk(2, -1);
    pieces.push_back(nn::linear(activation(hidden_act, gate_up[0]) * gate_up[1], down_proj[e]));
    start += count[e];
  }
  auto out = at::zeros_like(hidden);
  if (pieces.empty()) return out;
  // One scatter in expert order adds each token's experts in ascending order, as the eager loop does.
  out.index_add_(0, token, (at::cat(pieces, 0) * w).to(out.scalar_type()));
  return out;
}

// Sparse block ----------------------------------------------------------------------------------

SparseMoeBlock::SparseMoeBlock(const BuildContext& ctx, const SparseMoeKeys& keys) {
  auto child = [&](const char* name, int64_t width = 0) {
    return BuildContext{ctx.config, ctx.layer_idx, ctx.path + "." + name, width};
  };
  gate = register_module("gate", build<roles::Router>(keys.router, child("gate")));
  experts = register_module("experts", build<roles::Experts>(keys.experts, child("experts")));
  const auto& moe = ctx.config.decoder.moe;
  if (!keys.shared_expert.empty() && moe.shared_expert_intermediate_size > 0) {
    shared_expert = register_module(
        "shared_expert",
        build<roles::Mlp>(keys.shared_expert, child("shared_expert", moe.shared_expert_intermediate_size)));
    shared_expert_gate =
        register_module("shared_expert_gate", std::make_shared<Linear>(ctx.config.decoder.hidden_size, 1, false));
  }
}

at::Tensor SparseMoeBlock::forward(const at::Tensor& hidden) {
  const auto shape = hidden.sizes().vec();
  const auto x = hidden.reshape({-1, shape.back()});  // [T, H], rows b*S+t
  const auto routed = gate->forward(x);
  report_outputs(*gate, {routed.logits, routed.scores, routed.indices});
  auto out = experts->forward(x, routed.indices, routed.scores);
  report_outputs(*experts, {out});
  if (shared_expert) out = out + at::sigmoid(shared_expert_gate->forward(x)) * shared_expert->forward(x);
  return out.view(shape);
}

}  // namespace torchpatch::nn
