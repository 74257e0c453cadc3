// Mistral: Llama's blocks, a sliding window on every layer, no biases. The built-in classes are exported so a
// replacement can derive from them, as the Python `class CustomLlamaAttention(LlamaAttention)` does.
#pragma once

#include "torchpatch/export.h"

#include "torchpatch/models/decoder.h"
#include "torchpatch/models/family.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch::mistral {

/// Patch points: MistralAttention, MistralMLP, MistralRMSNorm, MistralDecoderLayer, MistralModel, MistralForCausalLM.
TORCHPATCH_API const DecoderSpec& spec();
/// The family descriptor (registered with the built-in families).
Family family();

class TORCHPATCH_API MistralAttention : public nn::GqaAttention {
 public:
  explicit MistralAttention(const BuildContext& ctx) : GqaAttention(attention_options(model_config(ctx).decoder)) {}
};

class TORCHPATCH_API MistralMLP : public nn::GatedMlp {
 public:
  explicit MistralMLP(const BuildContext& ctx) : GatedMlp(mlp_options(ctx)) {}
};

class TORCHPATCH_API MistralRMSNorm : public nn::RmsNorm {
 public:
  explicit MistralRMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps) {}
};

class TORCHPATCH_API MistralDecoderLayer : public PreNormDecoderLayer {
 public:
  explicit MistralDecoderLayer(const BuildContext& ctx) : PreNormDecoderLayer(ctx, spec()) {}
};

class TORCHPATCH_API MistralModel : public DecoderModel {
 public:
  explicit MistralModel(const BuildContext& ctx) : DecoderModel(ctx, spec()) {}
};

class TORCHPATCH_API MistralForCausalLM : public DecoderForCausalLM {
 public:
  explicit MistralForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}
};

}  // namespace torchpatch::mistral
