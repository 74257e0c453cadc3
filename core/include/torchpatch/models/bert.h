// BERT (hf-semantics 5.6): every Hugging Face class is a patch point under its name, and the built-in
// classes are exported so a replacement can derive from one. Post-norm layers, absolute positions,
// token types; an encoder by default, a causal decoder with cross-attention when the config says so.
#pragma once

#include "torchpatch/export.h"

#include <memory>

#include <torch/nn/modules/container/modulelist.h>

#include "torchpatch/nn/layer_norm.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/models/bert_roles.h"
#include "torchpatch/models/family.h"
#include "torchpatch/nn/mlp.h"

namespace torchpatch::bert {

/// embeddings.{word,position,token_type}_embeddings.weight, embeddings.LayerNorm.{weight,bias}.
class TORCHPATCH_API BertEmbeddings : public roles::BertEmbeddings {
 public:
  explicit BertEmbeddings(const BuildContext& ctx);
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& token_type_ids,
                     const at::Tensor& position_ids) override;

  std::shared_ptr<nn::Embedding> word_embeddings, position_embeddings, token_type_embeddings;
  std::shared_ptr<nn::LayerNorm> LayerNorm;  // NOLINT: Hugging Face's parameter name
};

/// query/key/value: Linear(H, H) with bias each.
class TORCHPATCH_API BertSelfAttention : public roles::BertSelfAttention {
 public:
  explicit BertSelfAttention(const BuildContext& ctx);
  at::Tensor forward(const at::Tensor& hidden, const BertAttentionInputs& inputs) override;

  std::shared_ptr<roles::Linear> query, key, value;
  int64_t num_heads;
};

/// The same projections; keys and values come from the encoder's output.
class TORCHPATCH_API BertCrossAttention : public roles::BertCrossAttention {
 public:
  explicit BertCrossAttention(const BuildContext& ctx);
  at::Tensor forward(const at::Tensor& hidden, const BertAttentionInputs& inputs) override;

  std::shared_ptr<roles::Linear> query, key, value;
  int64_t num_heads;
};

/// dense: Linear(H, H), LayerNorm(H).
class TORCHPATCH_API BertSelfOutput : public roles::BertSelfOutput {
 public:
  explicit BertSelfOutput(const BuildContext& ctx);
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& input) override;

  std::shared_ptr<roles::Linear> dense;
  std::shared_ptr<nn::LayerNorm> LayerNorm;  // NOLINT
};

/// self: BertSelfAttention (BertCrossAttention when ctx.is_cross_attention), output: BertSelfOutput.
class TORCHPATCH_API BertAttention : public roles::BertAttention {
 public:
  explicit BertAttention(const BuildContext& ctx);
  at::Tensor forward(const at::Tensor& hidden, const BertAttentionInputs& inputs) override;

  std::shared_ptr<roles::BertSelfAttention> self_attention;    ///< "self", for self-attention
  std::shared_ptr<roles::BertCrossAttention> cross_attention;  ///< "self", for cross-attention
  std::shared_ptr<roles::BertSelfOutput> output;
};

/// dense: Linear(H, I), then config.hidden_act.
class TORCHPATCH_API BertIntermediate : public roles::BertIntermediate {
 public:
  explicit BertIntermediate(const BuildContext& ctx);
  at::Tensor forward(const at::Tensor& x) override;

  std::shared_ptr<roles::Linear> dense;
  nn::Activation act;
};

/// dense: Linear(I, H), LayerNorm(H).
class TORCHPATCH_API BertOutput : public roles::BertOutput {
 public:
  explicit BertOutput(const BuildContext& ctx);
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& input) override;

  std::shared_ptr<roles::Linear> dense;
  std::shared_ptr<nn::LayerNorm> LayerNorm;  // NOLINT
};

/// attention, crossattention (config.add_cross_attention), intermediate, output.
class TORCHPATCH_API BertLayer : public roles::BertLayer {
 public:
  explicit BertLayer(const BuildContext& ctx);
  at::Tensor forward(const at::Tensor& hidden, const BertAttentionInputs& inputs) override;

  std::shared_ptr<roles::BertAttention> attention, crossattention;
  std::shared_ptr<roles::BertIntermediate> intermediate;
  std::shared_ptr<roles::BertOutput> output;
};

/// layer.{i}: BertLayer.
class TORCHPATCH_API BertEncoder : public roles::BertEncoder {
 public:
  explicit BertEncoder(const BuildContext& ctx);
  at::Tensor forward(const at::Tensor& hidden, const BertAttentionInputs& inputs,
                     std::vector<at::Tensor>* all_hidden) override;

  torch::nn::ModuleList layer{nullptr};

 private:
  std::vector<std::shared_ptr<roles::BertLayer>> layers_;
};

/// dense: Linear(H, H), tanh, on the first token.
class TORCHPATCH_API BertPooler : public roles::BertPooler {
 public:
  explicit BertPooler(const BuildContext& ctx);
  at::Tensor forward(const at::Tensor& hidden) override;

  std::shared_ptr<roles::Linear> dense;
};

/// embeddings, encoder, pooler (unless ctx.args "add_pooling_layer" is false). Writes last_hidden_state,
/// pooler_output and, when asked, hidden_states (embeddings, then each layer's output).
class TORCHPATCH_API BertModel : public roles::BertModel {
 public:
  explicit BertModel(const BuildContext& ctx);

  std::shared_ptr<roles::BertEmbeddings> embeddings;
  std::shared_ptr<roles::BertEncoder> encoder;
  std::shared_ptr<roles::BertPooler> pooler;  ///< null without a pooling layer

 private:
  std::string prefix_;  // this model's path in the whole model, for messages

 protected:
  ModelOutput forward_impl(const ModelInputs& inputs) override;
};

/// cls.predictions: transform (dense, act, LayerNorm), then the decoder, whose weight is the word
/// embedding table (tied) and whose bias is `bias`: one tensor each, as in Hugging Face.
class TORCHPATCH_API BertLMPredictionHead : public torch::nn::Module {
 public:
  BertLMPredictionHead(const ModelConfig& config, const at::Tensor& word_embeddings);
  at::Tensor forward(const at::Tensor& hidden) const;

  std::shared_ptr<roles::Linear> transform_dense;
  std::shared_ptr<nn::LayerNorm> transform_norm;
  std::shared_ptr<torch::nn::Module> decoder;  ///< holds decoder.weight and decoder.bias
  at::Tensor decoder_weight;  ///< [V, H], the word embedding table itself when tied
  at::Tensor bias;            ///< [V], the same tensor as decoder.bias
  nn::Activation act;
};

/// bert: BertModel (no pooler), cls.predictions: BertLMPredictionHead. Writes logits [B, T, V], and
/// with labels (-100 = ignored) the masked-LM loss.
class TORCHPATCH_API BertForMaskedLM : public roles::BertForMaskedLM {
 public:
  explicit BertForMaskedLM(const BuildContext& ctx);
  std::map<std::string, std::string> tied_weights() const override;

  std::shared_ptr<roles::BertModel> bert;
  std::shared_ptr<BertLMPredictionHead> predictions;

 protected:
  ModelOutput forward_impl(const ModelInputs& inputs) override;
  void complete(const ModelInputs& inputs, ModelOutput& out) const override;
};

/// The family descriptor (registered with the built-in families).
Family family();

}  // namespace torchpatch::bert
