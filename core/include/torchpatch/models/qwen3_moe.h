// Qwen3-MoE: per-head RMSNorm on queries and keys before RoPE, explicit head_dim, sparse blocks
// without a shared expert. The built-in classes are exported so replacements can derive from them.
#pragma once

#include "torchpatch/export.h"

#include "torchpatch/models/decoder.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/decoder_layer.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/nn/moe.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch::qwen3_moe {

/// Patch points: Qwen3MoeAttention, Qwen3MoeMLP (dense layers),
/// Qwen3MoeRMSNorm, Qwen3MoeDecoderLayer, Qwen3MoeSparseMoeBlock, Qwen3MoeTopKRouter, Qwen3MoeExperts.
extern TORCHPATCH_API const DecoderFamily kFamily;
extern TORCHPATCH_API const nn::DecoderLayerKeys kLayerKeys;
extern TORCHPATCH_API const nn::SparseMoeKeys kSparseKeys;

class TORCHPATCH_API Qwen3MoeAttention : public nn::QkNormAttention {
 public:
  using nn::QkNormAttention::QkNormAttention;
};

class TORCHPATCH_API Qwen3MoeMLP : public nn::GatedMlp {
 public:
  using nn::GatedMlp::GatedMlp;
};

class TORCHPATCH_API Qwen3MoeRMSNorm : public nn::RmsNorm {
 public:
  using nn::RmsNorm::RmsNorm;
};

class TORCHPATCH_API Qwen3MoeTopKRouter : public nn::TopKRouter {
 public:
  using nn::TopKRouter::TopKRouter;
};

class TORCHPATCH_API Qwen3MoeExperts : public nn::FusedExperts {
 public:
  using nn::FusedExperts::FusedExperts;
};

class TORCHPATCH_API Qwen3MoeSparseMoeBlock : public nn::SparseMoeBlock {
 public:
  explicit Qwen3MoeSparseMoeBlock(const BuildContext& ctx) : nn::SparseMoeBlock(ctx, kSparseKeys) {}
};

class TORCHPATCH_API Qwen3MoeDecoderLayer : public nn::PreNormDecoderLayer {
 public:
  explicit Qwen3MoeDecoderLayer(const BuildContext& ctx) : nn::PreNormDecoderLayer(ctx, kLayerKeys) {}
};

class TORCHPATCH_API Qwen3MoeModel : public DecoderModel {
 public:
  explicit Qwen3MoeModel(const ModelConfig& config) : DecoderModel(config, kFamily) {}
};

class TORCHPATCH_API Qwen3MoeForCausalLM : public DecoderForCausalLM {
 public:
  explicit Qwen3MoeForCausalLM(const ModelConfig& config) : DecoderForCausalLM(config, kFamily) {}
};

}  // namespace torchpatch::qwen3_moe
