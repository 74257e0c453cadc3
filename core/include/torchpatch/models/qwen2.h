// Qwen2: Llama's blocks with q/k/v biases and per-layer sliding windows. The built-in classes are exported
// so a replacement can derive from them.
#pragma once

#include "torchpatch/export.h"

#include "torchpatch/models/decoder.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/decoder_layer.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch::qwen2 {

/// Patch points: Qwen2Attention, Qwen2MLP, Qwen2RMSNorm, Qwen2DecoderLayer.
extern TORCHPATCH_API const DecoderFamily kFamily;
extern TORCHPATCH_API const nn::DecoderLayerKeys kLayerKeys;

class TORCHPATCH_API Qwen2Attention : public nn::GqaAttention {
 public:
  using nn::GqaAttention::GqaAttention;
};

class TORCHPATCH_API Qwen2MLP : public nn::GatedMlp {
 public:
  using nn::GatedMlp::GatedMlp;
};

class TORCHPATCH_API Qwen2RMSNorm : public nn::RmsNorm {
 public:
  using nn::RmsNorm::RmsNorm;
};

class TORCHPATCH_API Qwen2DecoderLayer : public nn::PreNormDecoderLayer {
 public:
  explicit Qwen2DecoderLayer(const BuildContext& ctx) : nn::PreNormDecoderLayer(ctx, kLayerKeys) {}
};

class TORCHPATCH_API Qwen2Model : public DecoderModel {
 public:
  explicit Qwen2Model(const ModelConfig& config) : DecoderModel(config, kFamily) {}
};

class TORCHPATCH_API Qwen2ForCausalLM : public DecoderForCausalLM {
 public:
  explicit Qwen2ForCausalLM(const ModelConfig& config) : DecoderForCausalLM(config, kFamily) {}
};

}  // namespace torchpatch::qwen2
