#include "torchpatch/models/blocks.h"

#include "torchpatch/models/family.h"

#include <fmt/format.h>

#include "torchpatch/error.h"

#include <cmath>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include "base/parallel.h"
#include "torchpatch/dist/process_group.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/patching/build.h"
#include "torchpatch/patching/outputs.h"

namespace torchpatch {

const ModelConfig& model_config(const BuildContext& ctx) { return ctx.config.as<ModelConfig>(); }

nn::GqaOptions attention_options(const DecoderConfig& d) {
  nn::GqaOptions o;
  o.hidden_size = d.hidden_size;
  o.num_heads = d.num_attention_heads;
  o.num_key_value_heads = d.num_key_value_heads;
  o.head_dim = d.head_dim;
  o.qkv_bias = d.qkv_bias;
  o.o_bias = d.o_bias;
  return o;
}

nn::GqaOptions family_attention_options(const ModelConfig& config) {
  const auto& family = config.family;
  return family && family->attention_options ? family->attention_options(config) : attention_options(config.decoder);
}

nn::QkNormOptions family_qk_norm_options(const ModelConfig& config) {
  const auto& family = config.family;
  if (family && family->qk_norm_options) return family->qk_norm_options(config);
  nn::QkNormOptions norm;
  norm.eps = config.decoder.rms_norm_eps;
  return norm;
}

const ExpertsLayout& experts_layout(const ModelConfig& config) {
  static const ExpertsLayout qwen;
  const auto& family = config.family;
  return family && family->decoder ? family->decoder->experts_layout : qwen;
}

nn::MlpOptions mlp_options(const BuildContext& ctx) {
  const auto& d = model_config(ctx).decoder;
  return {d.hidden_size, ctx.arg("intermediate_size", d.intermediate_size), d.mlp_bias, d.activation};
}

nn::RouterOptions router_options(const DecoderConfig& d) {
  return {d.hidden_size, d.moe.num_experts, d.moe.num_experts_per_tok, d.moe.norm_topk_prob};
}

nn::GroupedRouterOptions grouped_router_options(const DecoderConfig& d) {
  const auto& m = d.moe;
  return {d.hidden_size, m.num_experts, m.num_experts_per_tok, m.n_group, m.topk_group, m.norm_topk_prob,
          m.routed_scaling_factor};
}

nn::ExpertsOptions experts_options(const DecoderConfig& d) {
  return {d.hidden_size, d.moe.num_experts, d.moe.moe_intermediate_size, d.activation, d.moe.implementation};
}

nn::ClampedSwigluExpertsOptions clamped_swiglu_experts_options(const DecoderConfig& d) {
  return {d.hidden_size, d.moe.num_experts, d.moe.moe_intermediate_size, d.moe.swiglu_limit};
}

// -- decoder layer --------------------------------------------------------------------------------

std::vector<int64_t> FusedQkvAttention::split_sizes(const DecoderConfig& d) {
  return {d.num_attention_heads * d.head_dim, d.num_key_value_heads * d.head_dim, d.num_key_value_heads * d.head_dim};
}

FusedQkvAttention::FusedQkvAttention(const nn::GqaOptions& o)
    : sizes_{o.num_heads * o.head_dim, o.num_key_value_heads * o.head_dim, o.num_key_value_heads * o.head_dim},
      shape_{o.num_heads, o.num_key_value_heads, o.head_dim,
             o.scaling > 0 ? o.scaling : 1.0 / std::sqrt(static_cast<double>(o.head_dim)), o.softcap} {
  qkv_proj = register_module("qkv_proj", nn::make_linear("qkv_proj", o.hidden_size, sizes_[0] + sizes_[1] + sizes_[2], o.qkv_bias));
  o_proj = register_module("o_proj", nn::make_linear("o_proj", sizes_[0], o.hidden_size, o.o_bias));
}

at::Tensor FusedQkvAttention::forward_impl(const at::Tensor& hidden, const AttentionInputs& inputs) {
  const auto qkv = qkv_proj->forward(hidden).split_with_sizes(sizes_, -1);
  return o_proj->forward(nn::grouped_query_attention(qkv[0], qkv[1], qkv[2], inputs, shape_));
}

PreNormDecoderLayer::PreNormDecoderLayer(const BuildContext& ctx, const DecoderSpec& spec) {
  const auto& d = model_config(ctx).decoder;
  self_attn = register_module("self_attn", build<roles::Attention>(spec.attention, ctx.child("self_attn")));
  const bool sparse = !spec.sparse_block.empty() && d.moe.is_sparse_layer(ctx.layer_idx);
  if (!sparse && spec.mlp.empty()) {
    throw ConfigError(fmt::format("{}: layer {} is dense, but {} has only sparse layers (num_experts {})",
                                  spec.causal_lm, ctx.layer_idx, spec.causal_lm, d.moe.num_experts));
  }
  // Where the hub keeps it: "mlp", or the family's name for its sparse block (Mixtral: block_sparse_moe).
  const std::string name = sparse ? spec.experts_layout.block : "mlp";
  mlp = register_module(name, build<roles::Mlp>(sparse ? spec.sparse_block : spec.mlp, ctx.child(name)));
  input_layernorm = register_module("input_layernorm", build<roles::Norm>(spec.norm, ctx.child("input_layernorm")));
  post_attention_layernorm = register_module(
      "post_attention_layernorm", build<roles::Norm>(spec.norm, ctx.child("post_attention_layernorm")));
}

at::Tensor PreNormDecoderLayer::forward_impl(const at::Tensor& hidden, const AttentionInputs& inputs) {
  auto h = hidden + self_attn->forward(input_layernorm->forward(hidden), inputs);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

// -- sparse MoE block -----------------------------------------------------------------------------

SparseMoeBlock::SparseMoeBlock(const BuildContext& ctx, const DecoderSpec& spec) {
  const auto& d = model_config(ctx).decoder;
  const auto& router = spec.experts_layout.router;
  gate = register_module(router, build<roles::Router>(spec.router, ctx.child(router)));
  experts = register_module("experts", build<roles::Experts>(spec.experts, ctx.child("experts")));
  if (!spec.shared_expert.empty() && d.moe.shared_expert_intermediate_size > 0) {
    const nlohmann::json width{{"intermediate_size", d.moe.shared_expert_intermediate_size}};
    const auto& layout = spec.experts_layout;
    shared_expert = register_module(layout.shared, build<roles::Mlp>(spec.shared_expert, ctx.child(layout.shared, width)));
    if (layout.shared_gate) {
      shared_expert_gate = register_module("shared_expert_gate", nn::make_linear("shared_expert_gate", d.hidden_size, 1, false));
    }
  }
}

namespace {
// Decoding one token with a second thread: the shared expert runs on it while this thread routes and
// runs the chosen experts. Each half reads about as many weights as the other, and at one token their
// dispatched ops cost as much as their products, which splitting each product does not shorten. Only
// in float32 on torchpatch's own product kernels: the system BLAS and LibTorch's other-dtype products
// bring OpenMP threads of their own to the second thread (prefill ran at half speed afterwards).
// Not while outputs are captured (a capture sees only its own thread's calls), gradients are wanted,
// or a process group is active (the halves would issue their collectives in either order).
bool overlap_shared_expert(const at::Tensor& x) {
  return x.size(0) == 1 && x.scalar_type() == at::kFloat && at::get_num_threads() > 1 &&
         nn::decode_kernel() != nn::DecodeKernel::kBlas && !at::GradMode::is_enabled() && !capturing_outputs() &&
         !dist::active_group();
}
}  // namespace

at::Tensor SparseMoeBlock::forward(const at::Tensor& hidden) {
  const auto shape = hidden.sizes().vec();
  const auto x = hidden.reshape({-1, shape.back()});  // [T, H], rows b*S+t
  at::Tensor out, shared;
  const auto run_routed = [&] {
    const auto routed = gate->forward(x);
    out = experts->forward(x, routed.indices, routed.scores);
  };
  const auto run_shared = [&] {
    shared = shared_expert->forward(x);
    if (shared_expert_gate) shared = at::sigmoid(shared_expert_gate->forward(x)) * shared;
  };
  if (shared_expert && overlap_shared_expert(x)) {
    const at::ThreadLocalState state;  // inference mode and the rest, for the other thread
    base::parallel_for(0, 2, 1, [&](int64_t begin, int64_t end) {
      const at::ThreadLocalStateGuard guard(state);
      for (int64_t half = begin; half < end; ++half) half == 0 ? run_routed() : run_shared();
    });
  } else {
    run_routed();
    if (shared_expert) run_shared();
  }
  if (shared.defined()) out = out + shared;
  return out.view(shape);
}

}  // namespace torchpatch
