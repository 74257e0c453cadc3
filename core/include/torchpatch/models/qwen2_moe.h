// Qwen2-MoE: Qwen2's attention (q/k/v biases) with sparse blocks: a top-k router, fused experts and a
// shared expert behind a sigmoid gate. The built-in classes are exported so replacements can derive
// from them.
#pragma once

#include "torchpatch/export.h"

#include "torchpatch/models/decoder.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/decoder_layer.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/nn/moe.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch::qwen2_moe {

/// Patch points: Qwen2MoeAttention, Qwen2MoeMLP (dense layers and the shared expert),
/// Qwen2MoeRMSNorm, Qwen2MoeDecoderLayer, Qwen2MoeSparseMoeBlock, Qwen2MoeTopKRouter, Qwen2MoeExperts.
extern TORCHPATCH_API const DecoderFamily kFamily;
extern TORCHPATCH_API const nn::DecoderLayerKeys kLayerKeys;
extern TORCHPATCH_API const nn::SparseMoeKeys kSparseKeys;

class TORCHPATCH_API Qwen2MoeAttention : public nn::GqaAttention {
 public:
  using nn::GqaAttention::GqaAttention;
};

class TORCHPATCH_API Qwen2MoeMLP : public nn::GatedMlp {
 public:
  using nn::GatedMlp::GatedMlp;
};

class TORCHPATCH_API Qwen2MoeRMSNorm : public nn::RmsNorm {
 public:
  using nn::RmsNorm::RmsNorm;
};

class TORCHPATCH_API Qwen2MoeTopKRouter : public nn::TopKRouter {
 public:
  using nn::TopKRouter::TopKRouter;
};

class TORCHPATCH_API Qwen2MoeExperts : public nn::FusedExperts {
 public:
  using nn::FusedExperts::FusedExperts;
};

class TORCHPATCH_API Qwen2MoeSparseMoeBlock : public nn::SparseMoeBlock {
 public:
  explicit Qwen2MoeSparseMoeBlock(const BuildContext& ctx) : nn::SparseMoeBlock(ctx, kSparseKeys) {}
};

class TORCHPATCH_API Qwen2MoeDecoderLayer : public nn::PreNormDecoderLayer {
 public:
  explicit Qwen2MoeDecoderLayer(const BuildContext& ctx) : nn::PreNormDecoderLayer(ctx, kLayerKeys) {}
};

class TORCHPATCH_API Qwen2MoeModel : public DecoderModel {
 public:
  explicit Qwen2MoeModel(const ModelConfig& config) : DecoderModel(config, kFamily) {}
};

class TORCHPATCH_API Qwen2MoeForCausalLM : public DecoderForCausalLM {
 public:
  explicit Qwen2MoeForCausalLM(const ModelConfig& config) : DecoderForCausalLM(config, kFamily) {}
};

}  // namespace torchpatch::qwen2_moe
