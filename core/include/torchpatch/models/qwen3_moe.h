// Qwen3-MoE: per-head RMSNorm on queries and keys before RoPE, explicit head_dim, sparse blocks
// without a shared expert. The built-in classes are exported so replacements can derive from them.
#pragma once

#include "torchpatch/export.h"

#include "torchpatch/models/decoder.h"
#include "torchpatch/models/family.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/nn/moe.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch::qwen3_moe {

/// Patch points: Qwen3MoeAttention, Qwen3MoeMLP (dense layers), Qwen3MoeRMSNorm, Qwen3MoeDecoderLayer,
/// Qwen3MoeSparseMoeBlock, Qwen3MoeTopKRouter, Qwen3MoeExperts, Qwen3MoeModel, Qwen3MoeForCausalLM.
TORCHPATCH_API const DecoderSpec& spec();
/// The family descriptor (registered with the built-in families).
Family family();

class TORCHPATCH_API Qwen3MoeAttention : public nn::QkNormAttention {
 public:
  explicit Qwen3MoeAttention(const BuildContext& ctx)
      : QkNormAttention(attention_options(model_config(ctx).decoder), model_config(ctx).decoder.rms_norm_eps) {}
};

class TORCHPATCH_API Qwen3MoeMLP : public nn::GatedMlp {
 public:
  explicit Qwen3MoeMLP(const BuildContext& ctx) : GatedMlp(mlp_options(ctx)) {}
};

class TORCHPATCH_API Qwen3MoeRMSNorm : public nn::RmsNorm {
 public:
  explicit Qwen3MoeRMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps) {}
};

class TORCHPATCH_API Qwen3MoeTopKRouter : public nn::TopKRouter {
 public:
  explicit Qwen3MoeTopKRouter(const BuildContext& ctx) : TopKRouter(router_options(model_config(ctx).decoder)) {}
};

class TORCHPATCH_API Qwen3MoeExperts : public nn::FusedExperts {
 public:
  explicit Qwen3MoeExperts(const BuildContext& ctx) : FusedExperts(experts_options(model_config(ctx).decoder)) {}
};

class TORCHPATCH_API Qwen3MoeSparseMoeBlock : public SparseMoeBlock {
 public:
  explicit Qwen3MoeSparseMoeBlock(const BuildContext& ctx) : SparseMoeBlock(ctx, spec()) {}
};

class TORCHPATCH_API Qwen3MoeDecoderLayer : public PreNormDecoderLayer {
 public:
  explicit Qwen3MoeDecoderLayer(const BuildContext& ctx) : PreNormDecoderLayer(ctx, spec()) {}
};

class TORCHPATCH_API Qwen3MoeModel : public DecoderModel {
 public:
  explicit Qwen3MoeModel(const BuildContext& ctx) : DecoderModel(ctx, spec()) {}
};

class TORCHPATCH_API Qwen3MoeForCausalLM : public DecoderForCausalLM {
 public:
  explicit Qwen3MoeForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}
};

}  // namespace torchpatch::qwen3_moe
