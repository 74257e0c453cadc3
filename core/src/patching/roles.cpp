// The role contracts: what every implementation of a role owes its callers, done once here.
#include "torchpatch/patching/roles.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/error.h"
#include "torchpatch/patching/outputs.h"

namespace torchpatch {

AttentionCache::~AttentionCache() = default;

namespace roles {

Attention::~Attention() = default;
Mlp::~Mlp() = default;
Linear::~Linear() = default;
Norm::~Norm() = default;
DecoderLayer::~DecoderLayer() = default;
Router::~Router() = default;
Experts::~Experts() = default;

at::Tensor Attention::forward(const at::Tensor& hidden, const AttentionInputs& inputs) {
  const int64_t cached = inputs.cache ? inputs.cache->get_seq_length(inputs.layer_idx) : 0;
  at::Tensor out;
  if (!capturing_outputs()) {
    out = forward_impl(hidden, inputs);
  } else {
    // Hugging Face's (attn_output, attn_weights); the weights stay undefined for a class that does
    // not fill them, and a recorder asking for them then says so.
    at::Tensor weights;
    AttentionInputs with_weights = inputs;
    with_weights.weights_out = &weights;
    out = forward_impl(hidden, with_weights);
    report_outputs(*this, {out, weights});
  }
  if (inputs.cache && !inputs.cache->is_static(inputs.layer_idx)) {
    const int64_t expected = cached + hidden.size(1);
    const int64_t held = inputs.cache->get_seq_length(inputs.layer_idx);
    if (held != expected) {
      throw PatchError(fmt::format("layer {}: {} did not update the key/value cache (it holds {} tokens, expected {}); "
                                   "attention classes must append through inputs.cache, as "
                                   "nn::grouped_query_attention does",
                                   inputs.layer_idx, patch_record().class_name, held, expected));
    }
  }
  return out;
}

at::Tensor DecoderLayer::forward(const at::Tensor& hidden, const AttentionInputs& inputs) {
  auto out = forward_impl(hidden, inputs);
  report_outputs(*this, {out});
  return out;
}

RouterOutput Router::forward(const at::Tensor& hidden) {
  auto out = forward_impl(hidden);
  report_outputs(*this, {out.logits, out.scores, out.indices});
  return out;
}

at::Tensor Experts::forward(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights) {
  if (indices.dim() != 2 || indices.size(0) != hidden.size(0) || weights.sizes() != indices.sizes()) {
    throw InputError(fmt::format("experts at {}: indices {} and weights {} must both be [tokens {}, top_k]",
                                 patch_record().path, fmt::join(indices.sizes(), "x"), fmt::join(weights.sizes(), "x"),
                                 hidden.size(0)));
  }
  const int64_t experts = expert_count();
  if (experts > 0 && indices.numel() > 0) {
    // Read off the tensor: two reductions would cost more dispatch than a decode step's experts.
    const auto ids = indices.to(at::kCPU, at::kLong).contiguous();
    const auto* id = ids.data_ptr<int64_t>();
    const auto [low, high] = std::minmax_element(id, id + ids.numel());
    if (*low < 0 || *high >= experts) {
      throw InputError(fmt::format("experts at {}: an expert index is outside 0..{}", patch_record().path, experts - 1));
    }
  }
  auto out = forward_impl(hidden, indices, weights);
  report_outputs(*this, {out});
  return out;
}

}  // namespace roles
}  // namespace torchpatch
