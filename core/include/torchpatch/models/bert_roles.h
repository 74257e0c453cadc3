// BERT's roles: one per Hugging Face class, since BERT's blocks have shapes and call signatures of
// their own (post-norm sublayers that take the residual input, an encoder that returns every layer's
// output, a pooler). Each is a patch point under the class name.
#pragma once

#include "torchpatch/export.h"

#include <vector>

#include <ATen/core/Tensor.h>

#include "torchpatch/models/pretrained.h"
#include "torchpatch/patching/module_class.h"

namespace torchpatch {

/// What BERT's attention blocks receive, computed once per forward by BertModel.
struct TORCHPATCH_API BertAttentionInputs {
  /// Self-attention mask: additive, [B, 1, 1, KV] (encoder, padding only) or [B, 1, Q, KV] (decoder,
  /// causal); undefined = none.
  at::Tensor mask;
  at::Tensor encoder_hidden_states;  ///< [B, S, H] cross-attention keys/values; undefined = none
  at::Tensor encoder_mask;           ///< [B, 1, 1, S] additive; undefined = none
  int64_t layer_idx = -1;
  /// When set, self-attention stores its probabilities [B, nH, Q, KV] here ("attentions").
  at::Tensor* weights_out = nullptr;
  /// When set, cross-attention stores its probabilities [B, nH, Q, S] here ("cross_attentions").
  at::Tensor* cross_weights_out = nullptr;
};

namespace roles {

/// word + position + token type embeddings, LayerNorm: ids [B, T] -> [B, T, H].
class TORCHPATCH_API BertEmbeddings : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "BertEmbeddings";
  ~BertEmbeddings() override;
  /// token_type_ids [B, T] and position_ids [B, T] are always given (BertModel fills the defaults).
  virtual at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& token_type_ids,
                             const at::Tensor& position_ids) = 0;
};

/// Multi-head self-attention before its output projection: [B, Q, H] -> [B, Q, H].
class TORCHPATCH_API BertSelfAttention : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "BertSelfAttention";
  ~BertSelfAttention() override;
  virtual at::Tensor forward(const at::Tensor& hidden, const BertAttentionInputs& inputs) = 0;
};

/// Cross-attention over inputs.encoder_hidden_states: queries [B, Q, H] -> [B, Q, H].
class TORCHPATCH_API BertCrossAttention : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "BertCrossAttention";
  ~BertCrossAttention() override;
  virtual at::Tensor forward(const at::Tensor& hidden, const BertAttentionInputs& inputs) = 0;
};

/// Post-norm residual sublayer: LayerNorm(dense(hidden) + input) -> [B, T, H].
class TORCHPATCH_API BertSelfOutput : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "BertSelfOutput";
  ~BertSelfOutput() override;
  virtual at::Tensor forward(const at::Tensor& hidden, const at::Tensor& input) = 0;
};

/// An attention block (self- or cross-attention, then BertSelfOutput): [B, Q, H] -> [B, Q, H].
class TORCHPATCH_API BertAttention : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "BertAttention";
  ~BertAttention() override;
  virtual at::Tensor forward(const at::Tensor& hidden, const BertAttentionInputs& inputs) = 0;
};

/// The first half of the feed-forward block: act(dense(x)), [B, T, H] -> [B, T, I].
class TORCHPATCH_API BertIntermediate : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "BertIntermediate";
  ~BertIntermediate() override;
  virtual at::Tensor forward(const at::Tensor& x) = 0;
};

/// The second half: LayerNorm(dense(hidden [B, T, I]) + input [B, T, H]) -> [B, T, H].
class TORCHPATCH_API BertOutput : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "BertOutput";
  ~BertOutput() override;
  virtual at::Tensor forward(const at::Tensor& hidden, const at::Tensor& input) = 0;
};

/// One encoder layer: [B, T, H] -> [B, T, H].
class TORCHPATCH_API BertLayer : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "BertLayer";
  ~BertLayer() override;
  virtual at::Tensor forward(const at::Tensor& hidden, const BertAttentionInputs& inputs) = 0;
};

/// The layer stack: [B, T, H] -> [B, T, H]; appends each layer's output to `all_hidden` when given.
class TORCHPATCH_API BertEncoder : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "BertEncoder";
  ~BertEncoder() override;
  virtual at::Tensor forward(const at::Tensor& hidden, const BertAttentionInputs& inputs,
                             std::vector<at::Tensor>* all_hidden) = 0;
};

/// tanh(dense(hidden[:, 0])): [B, T, H] -> [B, H].
class TORCHPATCH_API BertPooler : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "BertPooler";
  ~BertPooler() override;
  virtual at::Tensor forward(const at::Tensor& hidden) = 0;
};

/// The base model (embeddings, encoder, pooler): a whole model, and a patch point under a task head.
class TORCHPATCH_API BertModel : public PretrainedModel {
 public:
  static constexpr const char* kRoleName = "BertModel";
  using PretrainedModel::PretrainedModel;
  ~BertModel() override;
  std::string base_model_prefix() const override { return "bert"; }
};

/// The masked-LM model: a BertModel without pooler under `bert`, and the prediction head under `cls`.
class TORCHPATCH_API BertForMaskedLM : public PretrainedModel {
 public:
  static constexpr const char* kRoleName = "BertForMaskedLM";
  using PretrainedModel::PretrainedModel;
  ~BertForMaskedLM() override;
  std::string base_model_prefix() const override { return "bert"; }
  /// A base model's pooler and a pre-training checkpoint's next-sentence head have no place here.
  std::vector<std::string> ignored_checkpoint_keys() const override {
    return {"bert.pooler.", "cls.seq_relationship."};
  }
};

}  // namespace roles
}  // namespace torchpatch
