// tensor-parallel: attention split by heads and the MLP split along its intermediate dimension over
// the ranks of the active process group (dist/process_group.h), as Hugging Face's tp_plan and vLLM's
// Column/RowParallelLinear do:
//
//   q/k/v_proj, gate/up_proj   rows of rank r's heads / intermediate slice   [out / N, H]
//   o_proj, down_proj          the matching columns                           [H, in / N]
//   then one all-reduce of the block's output; an o_proj / down_proj bias is added by rank 0 only.
//
// With fewer key/value heads than ranks, each is replicated over world / heads ranks (vLLM's choice).
// Norms, embeddings and lm_head stay replicated. Each rank's weights are sliced as they load (the
// classes' conversion rules), so a rank holds only its part of the sharded projections; saving
// gathers them back into the hub layout. Classes are chosen, not applied by default: the CLI maps the
// families' attention and MLP keys to them when it runs as a group (--tp N or torchrun). Built with
// no active group they are the plain classes.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "parallel.h"

namespace torchpatch_tensor_parallel {

int64_t world_of(const std::shared_ptr<ProcessGroup>& group) { return group ? group->size() : 1; }

void all_reduce(const std::shared_ptr<ProcessGroup>& group, at::Tensor& partial) {
  if (group) group->all_reduce_sum(partial);
}

namespace {

// -- conversion ops -------------------------------------------------------------------------------------

// Part `rank / (world / parts)` of `parts` equal parts along `dim`: with fewer parts than ranks
// (key/value heads), consecutive ranks hold the same part.
class ShardOp : public checkpoint::ConversionOp {
 public:
  ShardOp(int64_t dim, int64_t parts, std::shared_ptr<ProcessGroup> group)
      : dim_(dim), parts_(parts), group_(std::move(group)) {}
  std::string name() const override {
    return fmt::format("Shard(dim={}, part {} of {})", dim_, index(), parts_);
  }
  checkpoint::PatternTensors convert(checkpoint::PatternTensors inputs, const std::vector<std::string>&,
                                     const std::vector<std::string>& targets) const override {
    auto& tensors = inputs.at(0).second;
    for (auto& t : tensors) {
      const int64_t size = t.size(dim_);
      if (size % parts_ != 0) {
        throw CheckpointError(fmt::format("{}: dimension {} has {} entries, which do not split into {} parts",
                                          targets.at(0), dim_, size, parts_));
      }
      t = t.narrow(dim_, index() * (size / parts_), size / parts_).contiguous();
    }
    return {{targets.at(0), std::move(tensors)}};
  }
  std::shared_ptr<checkpoint::ConversionOp> reverse() const override;

 private:
  int64_t index() const { return group_->rank() / (group_->size() / parts_); }
  int64_t dim_, parts_;
  std::shared_ptr<ProcessGroup> group_;
};

// Every part, gathered from the ranks and concatenated along `dim` (a collective: every rank saves).
class GatherOp : public checkpoint::ConversionOp {
 public:
  GatherOp(int64_t dim, int64_t parts, std::shared_ptr<ProcessGroup> group)
      : dim_(dim), parts_(parts), group_(std::move(group)) {}
  std::string name() const override { return fmt::format("Gather(dim={}, {} parts)", dim_, parts_); }
  checkpoint::PatternTensors convert(checkpoint::PatternTensors inputs, const std::vector<std::string>&,
                                     const std::vector<std::string>& targets) const override {
    auto& tensors = inputs.at(0).second;
    const int64_t replicas = group_->size() / parts_;
    for (auto& t : tensors) {
      const auto all = group_->all_gather(t.contiguous());
      std::vector<at::Tensor> parts;
      for (int64_t p = 0; p < parts_; ++p) parts.push_back(all[p * replicas]);
      t = at::cat(parts, dim_);
    }
    return {{targets.at(0), std::move(tensors)}};
  }
  std::shared_ptr<checkpoint::ConversionOp> reverse() const override {
    return std::make_shared<ShardOp>(dim_, parts_, group_);
  }

 private:
  int64_t dim_, parts_;
  std::shared_ptr<ProcessGroup> group_;
};

std::shared_ptr<checkpoint::ConversionOp> ShardOp::reverse() const {
  return std::make_shared<GatherOp>(dim_, parts_, group_);
}

// A bias added after an all-reduce: rank 0 keeps it, the others hold zeros; saving takes rank 0's.
class RankZeroOp : public checkpoint::ConversionOp {
 public:
  RankZeroOp(bool keep_on_zero, std::shared_ptr<ProcessGroup> group) : load_(keep_on_zero), group_(std::move(group)) {}
  std::string name() const override { return load_ ? "OnRankZero" : "FromRankZero"; }
  checkpoint::PatternTensors convert(checkpoint::PatternTensors inputs, const std::vector<std::string>&,
                                     const std::vector<std::string>& targets) const override {
    auto& tensors = inputs.at(0).second;
    for (auto& t : tensors) {
      if (load_) {
        if (group_->rank() != 0) t = at::zeros_like(t);
      } else {
        t = t.contiguous().clone();
        group_->broadcast(t, 0);
      }
    }
    return {{targets.at(0), std::move(tensors)}};
  }
  std::shared_ptr<checkpoint::ConversionOp> reverse() const override {
    return std::make_shared<RankZeroOp>(!load_, group_);
  }

 private:
  bool load_;
  std::shared_ptr<ProcessGroup> group_;
};

checkpoint::WeightConverter same_key(const std::string& key, checkpoint::OpPtr op) { return {{key}, {key}, {std::move(op)}}; }

struct ColumnSplit {
  std::string name;
  int64_t parts;  ///< the world size, or fewer (replicated key/value heads)
};

// Rows of the `column` projections, columns of the `row` projection, its bias on rank 0.
checkpoint::ConversionRules split_rules(const std::shared_ptr<ProcessGroup>& group, const std::vector<ColumnSplit>& column,
                                        const std::string& row) {
  checkpoint::ConversionRules rules;
  for (const auto& [name, parts] : column) {
    const auto rows = std::make_shared<ShardOp>(0, parts, group);
    rules.emplace_back(same_key(name + ".weight", rows));
    rules.emplace_back(same_key(name + ".bias", rows));
  }
  rules.emplace_back(same_key(row + ".weight", std::make_shared<ShardOp>(1, group->size(), group)));
  rules.emplace_back(same_key(row + ".bias", std::make_shared<RankZeroOp>(true, group)));
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

checkpoint::ConversionRules mlp_rules(const torchpatch::Config&) {
  const auto group = torchpatch::dist::active_group();
  if (!group) return {};
  return split_rules(group, {{"gate_proj", group->size()}, {"up_proj", group->size()}}, "down_proj");
}

// -- attention ------------------------------------------------------------------------------------------

// The family's attention options with rank r's share of the query and key/value heads.
torchpatch::nn::GqaOptions local_heads(const BuildContext& ctx, const std::shared_ptr<ProcessGroup>& group) {
  auto options = torchpatch::attention_options(torchpatch::model_config(ctx).decoder);
  const int64_t n = world_of(group), kv = options.num_key_value_heads;
  if (options.num_heads % n != 0 || (kv % n != 0 && n % kv != 0)) {
    throw ConfigError(fmt::format("{}: {} attention heads and {} key/value heads do not split over {} ranks (the "
                                  "attention heads must be a multiple of the ranks, the key/value heads a multiple "
                                  "or a divisor)",
                                  ctx.path, options.num_heads, kv, n));
  }
  options.num_heads /= n;
  options.num_key_value_heads = kv / kv_parts(kv, n);
  return options;
}

/// Grouped-query attention over this rank's heads; the output projection's partial sums are all-reduced.
class TensorParallelAttention : public torchpatch::nn::GqaAttention {
 public:
  explicit TensorParallelAttention(const BuildContext& ctx)
      : TensorParallelAttention(ctx, torchpatch::dist::active_group()) {}

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const torchpatch::AttentionInputs& inputs) override {
    auto out = GqaAttention::forward_impl(hidden, inputs).contiguous();
    all_reduce(group_, out);
    return out;
  }

 private:
  TensorParallelAttention(const BuildContext& ctx, std::shared_ptr<ProcessGroup> group)
      : GqaAttention(local_heads(ctx, group)), group_(std::move(group)) {}
  std::shared_ptr<ProcessGroup> group_;
};

/// Qwen3-MoE's attention (per-head RMSNorm on queries and keys) over this rank's heads.
class TensorParallelQkNormAttention : public torchpatch::nn::QkNormAttention {
 public:
  explicit TensorParallelQkNormAttention(const BuildContext& ctx)
      : TensorParallelQkNormAttention(ctx, torchpatch::dist::active_group()) {}

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const torchpatch::AttentionInputs& inputs) override {
    auto out = QkNormAttention::forward_impl(hidden, inputs).contiguous();
    all_reduce(group_, out);
    return out;
  }

 private:
  TensorParallelQkNormAttention(const BuildContext& ctx, std::shared_ptr<ProcessGroup> group)
      : QkNormAttention(local_heads(ctx, group), torchpatch::model_config(ctx).decoder.rms_norm_eps),
        group_(std::move(group)) {}
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace

// -- MLP ------------------------------------------------------------------------------------------------

namespace {
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
}  // namespace

TensorParallelMLP::TensorParallelMLP(const BuildContext& ctx) : TensorParallelMLP(ctx, torchpatch::dist::active_group()) {}

TensorParallelMLP::TensorParallelMLP(const BuildContext& ctx, std::shared_ptr<ProcessGroup> group)
    : GatedMlp(local_mlp(ctx, group)), group_(std::move(group)) {}

at::Tensor TensorParallelMLP::forward(const at::Tensor& x) {
  auto out = forward_partial(x).contiguous();
  all_reduce(group_, out);
  return out;
}

void register_plugin(torchpatch::Registrar& registrar) {
  registrar.add_replacement(torchpatch::module_class<TensorParallelAttention>("TensorParallelAttention"), {});
  registrar.add_conversion("TensorParallelAttention", attention_rules);
  registrar.add_replacement(torchpatch::module_class<TensorParallelQkNormAttention>("TensorParallelQkNormAttention"), {});
  registrar.add_conversion("TensorParallelQkNormAttention", attention_rules);
  registrar.add_replacement(torchpatch::module_class<TensorParallelMLP>("TensorParallelMLP"), {});
  registrar.add_conversion("TensorParallelMLP", mlp_rules);
  register_expert_parallel(registrar);
}

}  // namespace torchpatch_tensor_parallel

TORCHPATCH_PLUGIN("tensor-parallel", "1.0.0", torchpatch_tensor_parallel::register_plugin)
