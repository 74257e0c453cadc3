// Decoder-only transformers on shared blocks: the base model (embeddings, layers, final norm) and
// the causal-LM head. Each family (llama.h, ...) names its patch-point keys and nothing else.
#pragma once

#include "torchpatch/export.h"

#include <memory>
#include <string>
#include <vector>

#include <torch/nn/modules/container/modulelist.h>

#include "torchpatch/models/pretrained.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/nn/rotary.h"
#include "torchpatch/patching/roles.h"

namespace torchpatch {

/// A family's class names: its patch-point keys and its model classes.
struct TORCHPATCH_API DecoderFamily {
  std::string decoder_layer;  ///< e.g. "LlamaDecoderLayer"
  std::string norm;           ///< e.g. "LlamaRMSNorm" (the final norm)
  std::string base_model;     ///< e.g. "LlamaModel"
  std::string causal_lm;      ///< e.g. "LlamaForCausalLM"
};

/// `XModel`: embed_tokens, layers.{i}, norm. State-dict keys as in Hugging Face.
class TORCHPATCH_API DecoderModel : public PretrainedModel {
 public:
  /// `prefix` is this module's path in the whole model ("model" under a causal-LM head, "" alone).
  DecoderModel(const ModelConfig& config, const DecoderFamily& family, const std::string& prefix = "");

  ModelOutput forward(const ModelInputs& inputs) override;
  std::string base_model_prefix() const override { return "model"; }

  std::shared_ptr<nn::Embedding> embed_tokens;
  torch::nn::ModuleList layers{nullptr};
  std::shared_ptr<roles::Norm> norm;
  nn::RotaryEmbedding rotary_emb;

 private:
  std::vector<std::shared_ptr<roles::DecoderLayer>> layer_list_;
};

/// The language-model head: logits = hidden @ weight^T (no bias). When embeddings are tied its weight
/// is the embedding table itself, one tensor, so loading and gradients see a single parameter.
class TORCHPATCH_API LmHead : public torch::nn::Module {
 public:
  /// An own weight [vocab, hidden].
  LmHead(int64_t hidden_size, int64_t vocab_size);
  /// Shares `tied_weight` (the embedding table).
  explicit LmHead(const at::Tensor& tied_weight);

  at::Tensor forward(const at::Tensor& hidden) const;

  at::Tensor weight;  ///< [V, H]
};

/// `XForCausalLM`: model (a DecoderModel) and lm_head, tied to the embeddings when the config says so.
class TORCHPATCH_API DecoderForCausalLM : public PretrainedModel {
 public:
  DecoderForCausalLM(const ModelConfig& config, const DecoderFamily& family);

  ModelOutput forward(const ModelInputs& inputs) override;
  std::map<std::string, std::string> tied_weights() const override;
  std::string base_model_prefix() const override { return "model"; }

  std::shared_ptr<DecoderModel> model;
  std::shared_ptr<LmHead> lm_head;
};

/// Checks input_ids / attention_mask / position_ids against each other and the vocabulary, with
/// `past_len` tokens already cached; throws InputError naming the tensor and the fault.
TORCHPATCH_API void validate_decoder_inputs(const ModelInputs& inputs, int64_t vocab_size, int64_t past_len = 0);

/// Throws InputError when a position is past what the model supports (DecoderConfig::max_positions).
TORCHPATCH_API void check_positions(const at::Tensor& position_ids, const DecoderConfig& config);

}  // namespace torchpatch
