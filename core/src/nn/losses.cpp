#include "torchpatch/nn/losses.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/error.h"
#include "torchpatch/nn/linear.h"

namespace torchpatch::nn {

namespace {
// Hugging Face upcasts to float32; float64 stays as it is.
at::Tensor at_least_float(const at::Tensor& t) { return t.to(reduction_type(t.scalar_type())); }

// Labels [B, T] against logits [B, T, V]: ids in range or -100 (ignored).
at::Tensor checked_labels(const at::Tensor& logits, const at::Tensor& labels) {
  if (labels.dim() != 2 || labels.size(0) != logits.size(0) || labels.size(1) != logits.size(1)) {
    throw InputError(fmt::format("labels: shape {} does not match the logits' [batch, seq] {}x{}",
                                 fmt::join(labels.sizes(), "x"), logits.size(0), logits.size(1)));
  }
  const int64_t vocab = logits.size(-1);
  auto target = labels.to(at::kLong);
  if (((target < 0).logical_and(target != -100)).logical_or(target >= vocab).any().item<bool>()) {
    throw InputError(fmt::format("labels: ids must be in 0..{} or -100 (ignored)", vocab - 1));
  }
  return target;
}

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& target) {
  const int64_t vocab = logits.size(-1);
  return at::cross_entropy_loss(at_least_float(logits).reshape({-1, vocab}), target.reshape({-1}), {},
                                at::Reduction::Mean, /*ignore_index=*/-100);
}
}  // namespace

at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels) {
  const auto target = checked_labels(logits, labels);
  // Position t predicts label t+1; the last position predicts nothing.
  return cross_entropy(logits, at::constant_pad_nd(target, {0, 1}, -100).narrow(1, 1, target.size(1)));
}

at::Tensor masked_lm_loss(const at::Tensor& logits, const at::Tensor& labels) {
  return cross_entropy(logits, checked_labels(logits, labels));
}

at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k,
                               const at::Tensor& attention_mask) {
  if (router_logits.empty()) return at::zeros({}, at::kFloat);
  auto logits = at::cat(router_logits, 0);                  // [L*B*T, E]
  auto probs = at::softmax(at_least_float(logits), -1);
  auto chosen = std::get<1>(probs.topk(top_k, -1));         // [N, K]
  auto expert_mask = at::one_hot(chosen, num_experts).to(probs.scalar_type());  // [N, K, E]
  at::Tensor tokens_per_expert, prob_per_expert;
  if (!attention_mask.defined()) {
    tokens_per_expert = expert_mask.mean(0);  // [K, E]
    prob_per_expert = probs.mean(0);          // [E]
  } else {
    const int64_t rows = attention_mask.numel();
    if (logits.size(0) % rows != 0) {
      throw InputError(fmt::format("attention_mask: {} tokens do not divide the {} router rows",
                                   rows, logits.size(0)));
    }
    const int64_t layers = logits.size(0) / rows;
    auto keep = attention_mask.reshape({1, rows}).to(probs.scalar_type()).expand({layers, rows}).reshape({-1});  // [N]
    tokens_per_expert = (expert_mask * keep.view({-1, 1, 1})).sum(0) / keep.sum();
    prob_per_expert = (probs * keep.view({-1, 1})).sum(0) / keep.sum();
  }
  return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * static_cast<double>(num_experts);
}

}  // namespace torchpatch::nn
