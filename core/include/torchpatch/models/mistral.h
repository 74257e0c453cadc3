// Mistral: Llama's blocks, a sliding window on every layer; no biases. The built-in classes are exported
// so a replacement can derive from them.
#pragma once

#include "torchpatch/export.h"

#include "torchpatch/models/decoder.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/decoder_layer.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch::mistral {

/// Patch points: MistralAttention, MistralMLP, MistralRMSNorm, MistralDecoderLayer.
extern TORCHPATCH_API const DecoderFamily kFamily;
extern TORCHPATCH_API const nn::DecoderLayerKeys kLayerKeys;

class TORCHPATCH_API MistralAttention : public nn::GqaAttention {
 public:
  using nn::GqaAttention::GqaAttention;
};

class TORCHPATCH_API MistralMLP : public nn::GatedMlp {
 public:
  using nn::GatedMlp::GatedMlp;
};

class TORCHPATCH_API MistralRMSNorm : public nn::RmsNorm {
 public:
  using nn::RmsNorm::RmsNorm;
};

class TORCHPATCH_API MistralDecoderLayer : public nn::PreNormDecoderLayer {
 public:
  explicit MistralDecoderLayer(const BuildContext& ctx) : nn::PreNormDecoderLayer(ctx, kLayerKeys) {}
};

class TORCHPATCH_API MistralModel : public DecoderModel {
 public:
  explicit MistralModel(const ModelConfig& config) : DecoderModel(config, kFamily) {}
};

class TORCHPATCH_API MistralForCausalLM : public DecoderForCausalLM {
 public:
  explicit MistralForCausalLM(const ModelConfig& config) : DecoderForCausalLM(config, kFamily) {}
};

}  // namespace torchpatch::mistral
