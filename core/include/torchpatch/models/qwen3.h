// Qwen3 (dense): Llama's blocks with a per-head RMSNorm on queries and keys before RoPE and an
// explicit head_dim. The built-in classes are exported so replacements can derive from them.
#pragma once

#include "torchpatch/export.h"

#include "torchpatch/models/decoder.h"
#include "torchpatch/models/family.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch::qwen3 {

/// Patch points: Qwen3Attention, Qwen3MLP, Qwen3RMSNorm, Qwen3DecoderLayer, Qwen3Model, Qwen3ForCausalLM.
TORCHPATCH_API const DecoderSpec& spec();
/// The family descriptor (registered with the built-in families).
Family family();

class TORCHPATCH_API Qwen3Attention : public nn::QkNormAttention {
 public:
  explicit Qwen3Attention(const BuildContext& ctx)
      : QkNormAttention(attention_options(model_config(ctx).decoder), model_config(ctx).decoder.rms_norm_eps) {}
};

class TORCHPATCH_API Qwen3MLP : public nn::GatedMlp {
 public:
  explicit Qwen3MLP(const BuildContext& ctx) : GatedMlp(mlp_options(ctx)) {}
};

class TORCHPATCH_API Qwen3RMSNorm : public nn::RmsNorm {
 public:
  explicit Qwen3RMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps) {}
};

class TORCHPATCH_API Qwen3DecoderLayer : public PreNormDecoderLayer {
 public:
  explicit Qwen3DecoderLayer(const BuildContext& ctx) : PreNormDecoderLayer(ctx, spec()) {}
};

class TORCHPATCH_API Qwen3Model : public DecoderModel {
 public:
  explicit Qwen3Model(const BuildContext& ctx) : DecoderModel(ctx, spec()) {}
};

class TORCHPATCH_API Qwen3ForCausalLM : public DecoderForCausalLM {
 public:
  explicit Qwen3ForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}
};

}  // namespace torchpatch::qwen3
