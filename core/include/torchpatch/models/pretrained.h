// The base of every model torchpatch builds: inputs, outputs, config, and its patch points.
#pragma once

#include "torchpatch/export.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "torchpatch/checkpoint/target.h"
#include "torchpatch/models/config.h"
#include "torchpatch/patching/module_class.h"

namespace torchpatch {

class DynamicCache;
class RecorderTable;

/// What a forward pass takes. Only input_ids is required.
struct TORCHPATCH_API ModelInputs {
  at::Tensor input_ids;       ///< [B, T] int64
  at::Tensor attention_mask;  ///< [B, P+T] (P cached tokens), 1 = real token; undefined = all real
  at::Tensor position_ids;    ///< [B, T] int64; undefined = P..P+T-1
  at::Tensor token_type_ids;  ///< [B, T] segment ids (BERT); undefined = all 0
  /// BERT in decoder mode with cross-attention: the encoder's output [B, S, H] and its padding mask
  /// [B, S] (1 = real token; undefined = all real).
  at::Tensor encoder_hidden_states;
  at::Tensor encoder_attention_mask;
  bool output_hidden_states = false;
  /// Keys/values of earlier tokens; the forward appends this call's. Undefined with use_cache: a new one.
  std::shared_ptr<DynamicCache> past_key_values;
  bool use_cache = false;
  /// Logits for the last N positions only (0 = all); generation needs just the last one.
  int64_t logits_to_keep = 0;
  /// Named outputs to capture (Hugging Face's `output_<name>=True`), e.g. "router_logits" or a name
  /// added with register_output_recorder; each must have a recorder for this model class.
  std::vector<std::string> outputs;
  /// Next-token targets [B, T] (-100 = ignore): the output then has `loss`.
  at::Tensor labels;
  /// MoE models: capture router logits and compute the load-balancing `aux_loss` (added to `loss`
  /// times router_aux_loss_coef when labels are given).
  bool output_router_logits = false;
};

/// What a forward pass returns; tensors a model does not produce stay undefined.
struct TORCHPATCH_API ModelOutput {
  at::Tensor logits;                      ///< [B, T, V] for language-model heads
  at::Tensor last_hidden_state;           ///< [B, T, H]
  at::Tensor pooler_output;               ///< [B, H] (BERT with a pooler)
  std::vector<at::Tensor> hidden_states;  ///< L+1 entries when asked (Hugging Face convention)
  std::shared_ptr<DynamicCache> past_key_values;  ///< the cache, when one was given or use_cache was set
  /// Captured outputs by name (ModelInputs::outputs), one tensor per call of a matching module, in
  /// call order: for "router_logits", one [B*T, E] per sparse layer, rows b*T+t.
  std::map<std::string, std::vector<at::Tensor>> captured;
  at::Tensor loss;      ///< with labels: cross-entropy (+ router_aux_loss_coef * aux_loss)
  at::Tensor aux_loss;  ///< with output_router_logits on a MoE model
};

/// `out` with every tensor on the host (for files, printing and comparisons).
TORCHPATCH_API ModelOutput on_host(ModelOutput out);

/// A whole model. It is a PatchableModule so that a model nested in another (BERT's `bert` under a
/// task head) can be a patch point like any block.
class TORCHPATCH_API PretrainedModel : public PatchableModule, public checkpoint::Loadable {
 public:
  /// Keeps the output recorders in force (active_patch_tables()) for its captures.
  PretrainedModel(ModelConfig config, std::string class_name);
  ~PretrainedModel() override;

  /// Runs forward_impl on the model's device: inputs are moved there, outputs stay there. With
  /// `inputs.outputs` (or outputs the model needs itself, such as the router logits of the
  /// load-balancing loss), inside one CaptureOutputs of this class: `captured` holds them. Then
  /// `complete` adds what needs the captured outputs (losses).
  ModelOutput forward(const ModelInputs& inputs);

  const ModelConfig& config() const override { return config_; }
  /// Where the parameters are (the first one's device; the CPU for a model without parameters).
  c10::Device device() const;
  /// Hugging Face class name, e.g. "LlamaForCausalLM".
  const std::string& class_name() const override { return class_name_; }

  /// Every module built through a patch point, in module-tree order (the model itself not included).
  std::vector<PatchPoint> patch_points() const override;

  torch::nn::Module& module() override { return *this; }
  const torch::nn::Module& module() const override { return *this; }
  nlohmann::json config_json() const override { return config_.to_json(); }

  /// State-dict keys that share another key's tensor and are absent from checkpoints
  /// (e.g. lm_head.weight -> model.embed_tokens.weight when embeddings are tied).
  std::map<std::string, std::string> tied_weights() const override { return {}; }

  /// Where a task head keeps the base model ("model" for decoders, "bert" for BERT; Hugging Face's
  /// `base_model_prefix`). Loading adds or strips it, so a base checkpoint loads into a head model
  /// and a head checkpoint into the base model.
  std::string base_model_prefix() const override { return {}; }

  /// Starts of checkpoint keys to leave out without complaint when they name no parameter (Hugging
  /// Face's `_keys_to_ignore_on_load_unexpected`), e.g. "bert.pooler." for BertForMaskedLM.
  std::vector<std::string> ignored_checkpoint_keys() const override { return {}; }

  /// Asked by generate before each decoding step: whether to drop the cache and recompute the whole
  /// sequence of `sequence_length` tokens (padding included) rather than append one more to the
  /// `cached_length` cached. Phi-3 does so once, when a longrope sequence first passes its trained length.
  virtual bool recompute_at(int64_t sequence_length, int64_t cached_length) const { return false; }

 protected:
  /// The forward pass proper; `inputs.outputs` is empty here (capture is forward's business).
  virtual ModelOutput forward_impl(const ModelInputs& inputs) = 0;
  /// Outputs to capture beyond the ones asked for (added to `names`).
  virtual void required_outputs(const ModelInputs& inputs, std::vector<std::string>& names) const {}
  /// Called with the captured outputs in place: losses that need them.
  virtual void complete(const ModelInputs& inputs, ModelOutput& out) const {}

 private:
  ModelConfig config_;
  std::string class_name_;
  std::shared_ptr<const RecorderTable> recorders_;
};

}  // namespace torchpatch
