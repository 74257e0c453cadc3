// Llama. The built-in classes are exported so a replacement can derive from them, as the Python
// `class CustomLlamaAttention(LlamaAttention)` example does.
#pragma once

#include "torchpatch/export.h"

#include "torchpatch/models/decoder.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/decoder_layer.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch::llama {

/// Patch points: LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaDecoderLayer.
extern TORCHPATCH_API const DecoderFamily kFamily;
extern TORCHPATCH_API const nn::DecoderLayerKeys kLayerKeys;

class TORCHPATCH_API LlamaAttention : public nn::GqaAttention {
 public:
  using nn::GqaAttention::GqaAttention;
};

class TORCHPATCH_API LlamaMLP : public nn::GatedMlp {
 public:
  using nn::GatedMlp::GatedMlp;
};

class TORCHPATCH_API LlamaRMSNorm : public nn::RmsNorm {
 public:
  using nn::RmsNorm::RmsNorm;
};

class TORCHPATCH_API LlamaDecoderLayer : public nn::PreNormDecoderLayer {
 public:
  explicit LlamaDecoderLayer(const BuildContext& ctx) : nn::PreNormDecoderLayer(ctx, kLayerKeys) {}
};

class TORCHPATCH_API LlamaModel : public DecoderModel {
 public:
  explicit LlamaModel(const ModelConfig& config) : DecoderModel(config, kFamily) {}
};

class TORCHPATCH_API LlamaForCausalLM : public DecoderForCausalLM {
 public:
  explicit LlamaForCausalLM(const ModelConfig& config) : DecoderForCausalLM(config, kFamily) {}
};

}  // namespace torchpatch::llama
