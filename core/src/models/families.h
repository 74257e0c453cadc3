// Internal: what each model family contributes to the shared tables (patch points, defaults, classes).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "torchpatch/models/config.h"
#include "torchpatch/models/decoder.h"
#include "torchpatch/nn/decoder_layer.h"
#include "torchpatch/nn/moe.h"
#include "torchpatch/models/pretrained.h"
#include "torchpatch/patching/module_class.h"

namespace torchpatch {

/// A family: its model_type, Hugging Face's config defaults, and its model classes by name.
struct FamilyEntry {
  /// Which layers slide over a window (when the config has one).
  enum class SlidingLayers {
    kNone,          ///< Llama: no sliding window
    kAll,           ///< Mistral: every layer when `sliding_window` is set
    kFromMaxWindow,  ///< Qwen2: `use_sliding_window`, then `layer_types` or layers >= `max_window_layers`
    kAllWhenUsed     ///< Qwen3-MoE: every layer when `use_sliding_window`
  };
  /// Where attention and MLP biases come from.
  enum class Biases {
    kFromConfig,  ///< Llama: `attention_bias` (q/k/v/o) and `mlp_bias`
    kNone,        ///< Mistral: never
    kQkvOnly      ///< Qwen2: q/k/v always, o and the MLP never
  };
  std::string model_type;
  DecoderConfig defaults;
  SlidingLayers sliding = SlidingLayers::kNone;
  Biases biases = Biases::kFromConfig;
  bool moe = false;  ///< reads the MoeConfig fields
  bool bert = false;  ///< reads the BertConfig fields (and no decoder-only ones)
  std::string default_class;  ///< built when config.json names no known architecture
  std::map<std::string, std::function<std::shared_ptr<PretrainedModel>(const ModelConfig&)>> classes;
};

const std::map<std::string, FamilyEntry>& families();

/// The family of `model_type`; ConfigError listing the supported types for an unknown one.
const FamilyEntry& family_of(const std::string& model_type, const std::string& source);

/// The parts every decoder family shares: its model classes by Hugging Face name.
template <class CausalLM, class BaseModel>
FamilyEntry decoder_family(std::string model_type, const DecoderFamily& names, DecoderConfig defaults) {
  FamilyEntry family;
  family.model_type = std::move(model_type);
  family.defaults = std::move(defaults);
  family.default_class = names.causal_lm;
  family.classes[names.causal_lm] = [](const ModelConfig& c) { return std::make_shared<CausalLM>(c); };
  family.classes[names.base_model] = [](const ModelConfig& c) { return std::make_shared<BaseModel>(c); };
  return family;
}

/// Registers a decoder family's built-in patch-point classes under their keys.
template <class Attention, class Mlp, class Norm, class Layer>
void add_decoder_builtins(std::map<std::string, ModuleClass>& classes, const DecoderFamily& family,
                          const nn::DecoderLayerKeys& keys) {
  for (auto cls : {module_class<Attention>(keys.attention), module_class<Mlp>(keys.mlp), module_class<Norm>(keys.norm),
                   module_class<Layer>(family.decoder_layer)}) {
    classes.emplace(cls.name, cls);
  }
}

/// Registers a MoE family's sparse block, router and experts under their keys.
template <class Block, class Router, class Experts>
void add_moe_builtins(std::map<std::string, ModuleClass>& classes, const nn::DecoderLayerKeys& layer,
                      const nn::SparseMoeKeys& sparse) {
  for (auto cls : {module_class<Block>(layer.sparse_block), module_class<Router>(sparse.router),
                   module_class<Experts>(sparse.experts)}) {
    classes.emplace(cls.name, cls);
  }
}

// Per-family contributions.
FamilyEntry llama_family();
void add_llama_builtins(std::map<std::string, ModuleClass>& classes);
FamilyEntry mistral_family();
void add_mistral_builtins(std::map<std::string, ModuleClass>& classes);
FamilyEntry qwen2_family();
void add_qwen2_builtins(std::map<std::string, ModuleClass>& classes);
FamilyEntry qwen2_moe_family();
void add_qwen2_moe_builtins(std::map<std::string, ModuleClass>& classes);
FamilyEntry qwen3_moe_family();
void add_qwen3_moe_builtins(std::map<std::string, ModuleClass>& classes);
FamilyEntry bert_family();
void add_bert_builtins(std::map<std::string, ModuleClass>& classes);

}  // namespace torchpatch
