// Qwen2: Llama's blocks with q/k/v biases and optional sliding layers. The built-in classes are exported so a
// replacement can derive from them, as the Python `class CustomLlamaAttention(LlamaAttention)` does.
#pragma once

#include "torchpatch/export.h"

#include "torchpatch/models/decoder.h"
#include "torchpatch/models/family.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch::qwen2 {

/// Patch points: Qwen2Attention, Qwen2MLP, Qwen2RMSNorm, Qwen2DecoderLayer, Qwen2Model, Qwen2ForCausalLM.
TORCHPATCH_API const DecoderSpec& spec();
/// The family descriptor (registered with the built-in families).
Family family();

class TORCHPATCH_API Qwen2Attention : public nn::GqaAttention {
 public:
  explicit Qwen2Attention(const BuildContext& ctx) : GqaAttention(attention_options(model_config(ctx).decoder)) {}
};

class TORCHPATCH_API Qwen2MLP : public nn::GatedMlp {
 public:
  explicit Qwen2MLP(const BuildContext& ctx) : GatedMlp(mlp_options(ctx)) {}
};

class TORCHPATCH_API Qwen2RMSNorm : public nn::RmsNorm {
 public:
  explicit Qwen2RMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps) {}
};

class TORCHPATCH_API Qwen2DecoderLayer : public PreNormDecoderLayer {
 public:
  explicit Qwen2DecoderLayer(const BuildContext& ctx) : PreNormDecoderLayer(ctx, spec()) {}
};

class TORCHPATCH_API Qwen2Model : public DecoderModel {
 public:
  explicit Qwen2Model(const BuildContext& ctx) : DecoderModel(ctx, spec()) {}
};

class TORCHPATCH_API Qwen2ForCausalLM : public DecoderForCausalLM {
 public:
  explicit Qwen2ForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}
};

}  // namespace torchpatch::qwen2
