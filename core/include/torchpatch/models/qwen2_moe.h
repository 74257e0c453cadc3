// Qwen2-MoE: Qwen2's attention (q/k/v biases) with sparse blocks: a top-k router, fused experts and a
// shared expert behind a sigmoid gate. The built-in classes are exported so replacements can derive from them.
#pragma once

#include "torchpatch/export.h"

#include "torchpatch/models/decoder.h"
#include "torchpatch/models/family.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/nn/moe.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch::qwen2_moe {

/// Patch points: Qwen2MoeAttention, Qwen2MoeMLP (dense layers and the shared expert), Qwen2MoeRMSNorm, Qwen2MoeDecoderLayer,
/// Qwen2MoeSparseMoeBlock, Qwen2MoeTopKRouter, Qwen2MoeExperts, Qwen2MoeModel, Qwen2MoeForCausalLM.
TORCHPATCH_API const DecoderSpec& spec();
/// The family descriptor (registered with the built-in families).
Family family();

class TORCHPATCH_API Qwen2MoeAttention : public nn::GqaAttention {
 public:
  explicit Qwen2MoeAttention(const BuildContext& ctx)
      : GqaAttention(attention_options(model_config(ctx).decoder)) {}
};

class TORCHPATCH_API Qwen2MoeMLP : public nn::GatedMlp {
 public:
  explicit Qwen2MoeMLP(const BuildContext& ctx) : GatedMlp(mlp_options(ctx)) {}
};

class TORCHPATCH_API Qwen2MoeRMSNorm : public nn::RmsNorm {
 public:
  explicit Qwen2MoeRMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps) {}
};

class TORCHPATCH_API Qwen2MoeTopKRouter : public nn::TopKRouter {
 public:
  explicit Qwen2MoeTopKRouter(const BuildContext& ctx) : TopKRouter(router_options(model_config(ctx).decoder)) {}
};

class TORCHPATCH_API Qwen2MoeExperts : public nn::FusedExperts {
 public:
  explicit Qwen2MoeExperts(const BuildContext& ctx) : FusedExperts(experts_options(model_config(ctx).decoder)) {}
};

class TORCHPATCH_API Qwen2MoeSparseMoeBlock : public SparseMoeBlock {
 public:
  explicit Qwen2MoeSparseMoeBlock(const BuildContext& ctx) : SparseMoeBlock(ctx, spec()) {}
};

class TORCHPATCH_API Qwen2MoeDecoderLayer : public PreNormDecoderLayer {
 public:
  explicit Qwen2MoeDecoderLayer(const BuildContext& ctx) : PreNormDecoderLayer(ctx, spec()) {}
};

class TORCHPATCH_API Qwen2MoeModel : public DecoderModel {
 public:
  explicit Qwen2MoeModel(const BuildContext& ctx) : DecoderModel(ctx, spec()) {}
};

class TORCHPATCH_API Qwen2MoeForCausalLM : public DecoderForCausalLM {
 public:
  explicit Qwen2MoeForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}
};

}  // namespace torchpatch::qwen2_moe
