// tensor-parallel: attention split by heads and the MLP split along its intermediate dimension over
// the ranks of the active process group (dist/process_group.h), as Hugging Face's tp_plan and vLLM's
// Column/RowParallelLinear do:
//
//   q/k/v_proj, gate/up_proj   rows of rank r's heads / intermediate slice   [out / N, H]
//   o_proj, down_proj          the matching columns                           [H, in / N]
//   then one all-reduce of the block's output; an o_proj / down_proj bias is added by rank 0 only.
//
// Phi-3's fused qkv_proj and gate_up_proj are sliced per projection inside the fused tensor
// (sharding.cpp); Gemma2 keeps its query scale and soft cap; OLMo 2's q/k norms over the whole
// projection sum their squares over the ranks. The MoE experts: expert_parallel.cpp.
// With fewer key/value heads than ranks, each is replicated over world / heads ranks (vLLM's choice).
// Norms, embeddings and lm_head stay replicated. Each rank's weights are sliced as they load (the
// classes' conversion rules), so a rank holds only its part of the sharded projections; saving
// gathers them back into the hub layout. Classes are chosen, not applied by default: the CLI maps the
// families' attention and MLP keys to them when it runs as a group (--tp N or torchrun). Built with
// no active group they are the plain classes.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <tuple>
#include <utility>

#include "parallel.h"
#include "sharding.h"
#include "torchpatch/models/family.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch_tensor_parallel {

int64_t world_of(const std::shared_ptr<ProcessGroup>& group) { return group ? group->size() : 1; }

void all_reduce(const std::shared_ptr<ProcessGroup>& group, at::Tensor& partial) {
  if (group) group->all_reduce_sum(partial);
}

at::Tensor copy_to_ranks(const at::Tensor& x, const std::shared_ptr<ProcessGroup>& group) {
  if (!group || !at::GradMode::is_enabled() || !x.requires_grad()) return x;
  auto copy = x.view_as(x);
  // The hook holds the group: it lives as long as the graph that may call it.
  copy.register_hook([group](const at::Tensor& grad) {
    auto sum = grad.contiguous().clone();
    group->all_reduce_sum(sum);
    return sum;
  });
  return copy;
}

namespace {

// -- conversion rules -----------------------------------------------------------------------------------

struct ColumnSplit {
  std::string name;
  int64_t parts;  ///< the world size, or fewer (replicated key/value heads)
};

// Rows of the `column` projections, columns of the `row` projection, its bias on rank 0.
checkpoint::ConversionRules split_rules(const std::shared_ptr<ProcessGroup>& group, const std::vector<ColumnSplit>& column,
                                        const std::string& row) {
  checkpoint::ConversionRules rules;
  for (const auto& [name, parts] : column) {
    const auto rows = shard(0, parts, group);
    rules.emplace_back(same_key(name + ".weight", rows));
    rules.emplace_back(same_key(name + ".bias", rows));
  }
  rules.emplace_back(same_key(row + ".weight", shard(1, group->size(), group)));
  rules.emplace_back(same_key(row + ".bias", on_rank_zero(group)));
  return rules;
}

// Key/value heads per rank: a share of them, or one replicated over world / heads ranks (vLLM's
// choice when there are fewer key/value heads than ranks).
int64_t kv_parts(int64_t kv_heads, int64_t world) { return kv_heads % world == 0 ? world : kv_heads; }

checkpoint::ConversionRules attention_rules(const torchpatch::Config& config) {
  const auto group = torchpatch::dist::active_group();
  if (!group) return {};
  const int64_t world = group->size();
  const int64_t kv = kv_parts(config.as<torchpatch::ModelConfig>().decoder.num_key_value_heads, world);
  return split_rules(group, {{"q_proj", world}, {"k_proj", kv}, {"v_proj", kv}}, "o_proj");
}

// OLMo 2's q_norm / k_norm weights span the whole projection: sliced with it.
checkpoint::ConversionRules projection_qk_norm_attention_rules(const torchpatch::Config& config) {
  auto rules = attention_rules(config);
  if (const auto group = torchpatch::dist::active_group()) {
    const int64_t kv = kv_parts(config.as<torchpatch::ModelConfig>().decoder.num_key_value_heads, group->size());
    rules.emplace_back(same_key("q_norm.weight", shard(0, group->size(), group)));
    rules.emplace_back(same_key("k_norm.weight", shard(0, kv, group)));
  }
  return rules;
}

checkpoint::ConversionRules mlp_rules(const torchpatch::Config&) {
  const auto group = torchpatch::dist::active_group();
  if (!group) return {};
  return split_rules(group, {{"gate_proj", group->size()}, {"up_proj", group->size()}}, "down_proj");
}

// Fused projections (Phi-3): each rank keeps its part of every projection inside qkv_proj / gate_up_proj.
checkpoint::ConversionRules fused_attention_rules(const torchpatch::Config& config) {
  const auto group = torchpatch::dist::active_group();
  if (!group) return {};
  const auto& d = config.as<torchpatch::ModelConfig>().decoder;
  const int64_t world = group->size(), kv = kv_parts(d.num_key_value_heads, world);
  const auto sizes = torchpatch::FusedQkvAttention::split_sizes(d);
  const auto rows = shard(0, {{sizes[0], world}, {sizes[1], kv}, {sizes[2], kv}}, group);
  return {same_key("qkv_proj.weight", rows), same_key("qkv_proj.bias", rows),
          same_key("o_proj.weight", shard(1, world, group)), same_key("o_proj.bias", on_rank_zero(group))};
}

checkpoint::ConversionRules fused_mlp_rules(const torchpatch::Config& config) {
  const auto group = torchpatch::dist::active_group();
  if (!group) return {};
  const int64_t width = config.as<torchpatch::ModelConfig>().decoder.intermediate_size, world = group->size();
  return {same_key("gate_up_proj.weight", shard(0, {{width, world}, {width, world}}, group)),
          same_key("down_proj.weight", shard(1, world, group))};
}

// -- attention ------------------------------------------------------------------------------------------

// Query heads and key/value heads per rank (ConfigError naming the module when they do not split).
std::pair<int64_t, int64_t> local_head_counts(const BuildContext& ctx, int64_t heads, int64_t kv, int64_t n) {
  if (heads % n != 0 || (kv % n != 0 && n % kv != 0)) {
    throw ConfigError(fmt::format("{}: {} attention heads and {} key/value heads do not split over {} ranks (the "
                                  "attention heads must be a multiple of the ranks, the key/value heads a multiple "
                                  "or a divisor)",
                                  ctx.path, heads, kv, n));
  }
  return {heads / n, kv / kv_parts(kv, n)};
}

// The family's attention options (Gemma2 gives its query scale and soft cap) with rank r's share of the heads.
torchpatch::nn::GqaOptions local_heads(const BuildContext& ctx, const std::shared_ptr<ProcessGroup>& group) {
  auto options = torchpatch::family_attention_options(torchpatch::model_config(ctx));
  std::tie(options.num_heads, options.num_key_value_heads) =
      local_head_counts(ctx, options.num_heads, options.num_key_value_heads, world_of(group));
  return options;
}

// An attention block built over this rank's heads: its output (o_proj's partial sums) is all-reduced.
template <class Attention>
class ReducedAttention : public Attention {
 protected:
  template <class... Args>
  explicit ReducedAttention(Args&&... args)
      : Attention(std::forward<Args>(args)...), group_(torchpatch::dist::active_group()) {}

  at::Tensor forward_impl(const at::Tensor& hidden, const torchpatch::AttentionInputs& inputs) override {
    auto out = Attention::forward_impl(copy_to_ranks(hidden, group_), inputs).contiguous();
    all_reduce(group_, out);
    return out;
  }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

/// Grouped-query attention over this rank's heads.
class TensorParallelAttention : public ReducedAttention<torchpatch::nn::GqaAttention> {
 public:
  explicit TensorParallelAttention(const BuildContext& ctx)
      : ReducedAttention(local_heads(ctx, torchpatch::dist::active_group())) {}
};

/// Qwen3-MoE's attention (per-head RMSNorm on queries and keys) over this rank's heads.
class TensorParallelQkNormAttention : public ReducedAttention<torchpatch::nn::QkNormAttention> {
 public:
  explicit TensorParallelQkNormAttention(const BuildContext& ctx)
      : ReducedAttention(local_heads(ctx, torchpatch::dist::active_group()),
                         torchpatch::family_qk_norm_options(torchpatch::model_config(ctx))) {}
};

// An RMSNorm over a vector whose parts the ranks hold (OLMo 2's q/k norm over the whole projection):
// each rank's squared sum is all-reduced, so every part is scaled by the whole vector's mean square.
// `replicas`: how many ranks hold each part (replicated key/value heads), to count it once.
class SummedRmsNorm : public torchpatch::nn::RmsNorm {
 public:
  SummedRmsNorm(int64_t local_width, int64_t width, int64_t replicas, double eps, bool unit_offset)
      : RmsNorm(local_width, eps, unit_offset), width_(width), replicas_(replicas), group_(torchpatch::dist::active_group()) {}

  at::Tensor forward(const at::Tensor& x) override {
    const auto input_dtype = x.scalar_type();
    const auto h = x.to(at::kFloat);
    const auto squares = h.pow(2).sum(-1, /*keepdim=*/true);
    auto total = squares.detach().contiguous().clone();
    all_reduce(group_, total);
    // Each part is held by `replicas_` ranks, so the total counts it that many times: the value is
    // total / replicas, its derivative in this rank's squares 1 / replicas; every rank's output
    // depends on it, so its gradient is summed over the ranks (copy_to_ranks).
    const auto summed = copy_to_ranks((squares + (total - squares.detach())) / static_cast<double>(replicas_), group_);
    const auto normed = h * at::rsqrt(summed / static_cast<double>(width_) + variance_epsilon);
    if (unit_offset) return (normed * (1.0 + weight.to(at::kFloat))).to(input_dtype);
    return weight * normed.to(input_dtype);
  }

 private:
  int64_t width_, replicas_;
  std::shared_ptr<ProcessGroup> group_;
};

torchpatch::nn::QkNormOptions projection_norm(const BuildContext& ctx) {
  auto options = torchpatch::family_qk_norm_options(torchpatch::model_config(ctx));
  options.per_head = false;  // what the kind means
  return options;
}

/// OLMo 2's and OLMoE's attention (q/k RMSNorm over the whole projection) over this rank's heads,
/// the norms' mean squares summed over the ranks.
class TensorParallelProjectionQkNormAttention : public ReducedAttention<torchpatch::nn::QkNormAttention> {
 public:
  explicit TensorParallelProjectionQkNormAttention(const BuildContext& ctx)
      : ReducedAttention(local_heads(ctx, torchpatch::dist::active_group()), projection_norm(ctx)) {
    const auto& d = torchpatch::model_config(ctx).decoder;
    const int64_t world = world_of(torchpatch::dist::active_group());
    const int64_t replicas = world / kv_parts(d.num_key_value_heads, world);
    q_norm = replace_module("q_norm", std::make_shared<SummedRmsNorm>(num_heads * head_dim, d.num_attention_heads * head_dim,
                                                                       1, norm_options.eps, norm_options.unit_offset));
    k_norm = replace_module("k_norm", std::make_shared<SummedRmsNorm>(num_key_value_heads * head_dim,
                                                                       d.num_key_value_heads * head_dim, replicas,
                                                                       norm_options.eps, norm_options.unit_offset));
  }
};

/// Phi-3's attention (one fused qkv_proj) over this rank's heads.
class TensorParallelFusedQkvAttention : public ReducedAttention<torchpatch::FusedQkvAttention> {
 public:
  explicit TensorParallelFusedQkvAttention(const BuildContext& ctx)
      : ReducedAttention(local_heads(ctx, torchpatch::dist::active_group())) {}
};

// -- MLP ------------------------------------------------------------------------------------------------

torchpatch::nn::MlpOptions local_mlp(const BuildContext& ctx, const std::shared_ptr<ProcessGroup>& group) {
  auto options = torchpatch::mlp_options(ctx);
  const int64_t n = world_of(group);
  if (options.intermediate_size % n != 0) {
    throw ConfigError(fmt::format("{}: intermediate size {} does not split over {} ranks", ctx.path,
                                  options.intermediate_size, n));
  }
  options.intermediate_size /= n;
  return options;
}

/// Phi-3's MLP (gate and up fused in gate_up_proj) over this rank's slice of the intermediate dimension.
class TensorParallelFusedMLP : public torchpatch::roles::Mlp {
 public:
  explicit TensorParallelFusedMLP(const BuildContext& ctx)
      : act_(torchpatch::model_config(ctx).decoder.activation), group_(torchpatch::dist::active_group()) {
    const auto& d = torchpatch::model_config(ctx).decoder;
    const auto width = local_mlp(ctx, group_).intermediate_size;
    gate_up_proj = register_module("gate_up_proj", torchpatch::nn::make_linear("gate_up_proj", d.hidden_size, 2 * width, false));
    down_proj = register_module("down_proj", torchpatch::nn::make_linear("down_proj", width, d.hidden_size, false));
  }

  // down(up * act(gate)), as Phi3MLP; then the all-reduce
  at::Tensor forward(const at::Tensor& x) override {
    const auto gate_up = gate_up_proj->forward(copy_to_ranks(x, group_)).chunk(2, -1);
    auto out = down_proj->forward(gate_up[1] * torchpatch::nn::activate(act_, gate_up[0])).contiguous();
    all_reduce(group_, out);
    return out;
  }

  std::shared_ptr<torchpatch::roles::Linear> gate_up_proj, down_proj;

 private:
  torchpatch::nn::Activation act_;
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace

TensorParallelMLP::TensorParallelMLP(const BuildContext& ctx) : TensorParallelMLP(ctx, torchpatch::dist::active_group()) {}

TensorParallelMLP::TensorParallelMLP(const BuildContext& ctx, std::shared_ptr<ProcessGroup> group)
    : GatedMlp(local_mlp(ctx, group)), group_(std::move(group)) {}

at::Tensor TensorParallelMLP::forward(const at::Tensor& x) {
  auto out = forward_partial(copy_to_ranks(x, group_)).contiguous();
  all_reduce(group_, out);
  return out;
}

void register_plugin(torchpatch::Registrar& registrar) {
  registrar.add_replacement(torchpatch::module_class<TensorParallelAttention>("TensorParallelAttention"), {});
  registrar.add_conversion("TensorParallelAttention", attention_rules);
  registrar.add_replacement(torchpatch::module_class<TensorParallelQkNormAttention>("TensorParallelQkNormAttention"), {});
  registrar.add_conversion("TensorParallelQkNormAttention", attention_rules);
  registrar.add_replacement(
      torchpatch::module_class<TensorParallelProjectionQkNormAttention>("TensorParallelProjectionQkNormAttention"), {});
  registrar.add_conversion("TensorParallelProjectionQkNormAttention", projection_qk_norm_attention_rules);
  registrar.add_replacement(torchpatch::module_class<TensorParallelMLP>("TensorParallelMLP"), {});
  registrar.add_conversion("TensorParallelMLP", mlp_rules);
  registrar.add_replacement(torchpatch::module_class<TensorParallelFusedQkvAttention>("TensorParallelFusedQkvAttention"), {});
  registrar.add_conversion("TensorParallelFusedQkvAttention", fused_attention_rules);
  registrar.add_replacement(torchpatch::module_class<TensorParallelFusedMLP>("TensorParallelFusedMLP"), {});
  registrar.add_conversion("TensorParallelFusedMLP", fused_mlp_rules);
  register_expert_parallel(registrar);
}

}  // namespace torchpatch_tensor_parallel

TORCHPATCH_PLUGIN("tensor-parallel", "1.0.0", torchpatch_tensor_parallel::register_plugin)
