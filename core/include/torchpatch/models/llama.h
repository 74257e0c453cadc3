// Llama: pre-norm layers, grouped-query attention, a gated SiLU MLP. The built-in classes are exported so a
// replacement can derive from them, as the Python `class CustomLlamaAttention(LlamaAttention)` does.
#pragma once

#include "torchpatch/export.h"

#include "torchpatch/models/decoder.h"
#include "torchpatch/models/family.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch::llama {

/// Patch points: LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaDecoderLayer, LlamaModel, LlamaForCausalLM.
TORCHPATCH_API const DecoderSpec& spec();
/// The family descriptor (registered with the built-in families).
Family family();

class TORCHPATCH_API LlamaAttention : public nn::GqaAttention {
 public:
  explicit LlamaAttention(const BuildContext& ctx) : GqaAttention(attention_options(model_config(ctx).decoder)) {}
};

class TORCHPATCH_API LlamaMLP : public nn::GatedMlp {
 public:
  explicit LlamaMLP(const BuildContext& ctx) : GatedMlp(mlp_options(ctx)) {}
};

class TORCHPATCH_API LlamaRMSNorm : public nn::RmsNorm {
 public:
  explicit LlamaRMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps) {}
};

class TORCHPATCH_API LlamaDecoderLayer : public PreNormDecoderLayer {
 public:
  explicit LlamaDecoderLayer(const BuildContext& ctx) : PreNormDecoderLayer(ctx, spec()) {}
};

class TORCHPATCH_API LlamaModel : public DecoderModel {
 public:
  explicit LlamaModel(const BuildContext& ctx) : DecoderModel(ctx, spec()) {}
};

class TORCHPATCH_API LlamaForCausalLM : public DecoderForCausalLM {
 public:
  explicit LlamaForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}
};

}  // namespace torchpatch::llama
