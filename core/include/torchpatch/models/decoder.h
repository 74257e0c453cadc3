// Decoder-only transformers on shared blocks: the base model (embeddings, layers, final norm) and
// the causal-LM head. Each family (llama.h, ...) names its patch-point keys and what it does
// differently, nothing else.
#pragma once

#include <optional>

#include "torchpatch/export.h"

#include <memory>
#include <string>
#include <vector>

#include <torch/nn/modules/container/modulelist.h>

#include "torchpatch/models/blocks.h"
#include "torchpatch/models/pretrained.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/nn/rotary.h"
#include "torchpatch/patching/roles.h"

namespace torchpatch {

/// `XModel`: embed_tokens, layers.{i}, norm. State-dict keys as in Hugging Face. A patch point under
/// the family's base-model key, alone or as the `model` of a causal LM.
class TORCHPATCH_API DecoderModel : public PretrainedModel {
 public:
  static constexpr const char* kRoleName = "DecoderModel";
  /// `ctx.path` is this module's path in the whole model ("model" under a causal-LM head, "" alone).
  DecoderModel(const BuildContext& ctx, const DecoderSpec& spec);

  std::string base_model_prefix() const override { return "model"; }

  std::shared_ptr<nn::Embedding> embed_tokens;
  torch::nn::ModuleList layers{nullptr};
  std::shared_ptr<roles::Norm> norm;
  nn::RotaryEmbedding rotary_emb;
  /// The sliding layers' own RoPE, when the config gives one (DecoderConfig::sliding_rope).
  std::optional<nn::RotaryEmbedding> sliding_rotary_emb;

 protected:
  ModelOutput forward_impl(const ModelInputs& inputs) override;
  /// ids [B, T] -> hidden [B, T, H]; Gemma scales the embeddings.
  virtual at::Tensor embed(const at::Tensor& ids);

 private:
  std::vector<std::shared_ptr<roles::DecoderLayer>> layer_list_;
};

/// The language-model head: logits = hidden @ weight^T (no bias). When embeddings are tied its weight
/// is the embedding table itself, one tensor, so loading and gradients see a single parameter.
/// The output projection of a model whose config ties it to the token embeddings: a float view of
/// the embedding table, outside the "Linear" patch point (its weight is not in checkpoints). An untied
/// lm_head is an ordinary Linear patch point at "lm_head".
class TORCHPATCH_API TiedLmHead : public nn::Linear {
 public:
  explicit TiedLmHead(const at::Tensor& tied_weight) : nn::Linear(tied_weight) {}
};

/// `XForCausalLM`: model (a DecoderModel) and lm_head, tied to the embeddings when the config says so.
class TORCHPATCH_API DecoderForCausalLM : public PretrainedModel {
 public:
  static constexpr const char* kRoleName = "CausalLM";
  DecoderForCausalLM(const BuildContext& ctx, const DecoderSpec& spec);

  std::map<std::string, std::string> tied_weights() const override;
  std::string base_model_prefix() const override { return "model"; }

  std::shared_ptr<DecoderModel> model;
  std::shared_ptr<roles::Linear> lm_head;  ///< [H -> V]

 protected:
  ModelOutput forward_impl(const ModelInputs& inputs) override;
  void required_outputs(const ModelInputs& inputs, std::vector<std::string>& names) const override;
  void complete(const ModelInputs& inputs, ModelOutput& out) const override;
  /// hidden [B, T, H] -> logits [B, T, V]; Gemma2 soft-caps them.
  virtual at::Tensor logits(const at::Tensor& hidden);
};

/// While one is alive on a thread, the checks below read no values of their tensors (shapes only):
/// for inputs a caller made on the device itself and knows to be valid (generation's own tokens and
/// positions), whose values a check would have to wait for, and which a CUDA graph cannot read.
class TORCHPATCH_API DeviceMadeInputs {
 public:
  DeviceMadeInputs();
  ~DeviceMadeInputs();
  DeviceMadeInputs(const DeviceMadeInputs&) = delete;
  DeviceMadeInputs& operator=(const DeviceMadeInputs&) = delete;
  static bool active();
};

/// Checks input_ids / attention_mask / position_ids against each other and the vocabulary, with
/// `past_len` tokens already cached; throws InputError naming the tensor and the fault.
TORCHPATCH_API void validate_decoder_inputs(const ModelInputs& inputs, int64_t vocab_size, int64_t past_len = 0);

/// Throws InputError when a position is past what the model supports: DecoderConfig::max_positions,
/// or max_position_embeddings for learned absolute positions (`rotary` false).
TORCHPATCH_API void check_positions(const at::Tensor& position_ids, const DecoderConfig& config, bool rotary = true);

}  // namespace torchpatch
