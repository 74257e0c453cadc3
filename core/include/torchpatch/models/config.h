// The typed configuration of the transformer families: the fields they share (DecoderConfig), each
// family's own fields (FamilyFields), Hugging Face's defaults filled in, enums resolved when read.
#pragma once

#include "torchpatch/export.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchpatch/config.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/nn/moe.h"
#include "torchpatch/nn/rotary.h"

namespace torchpatch {

using nn::RopeParameters;

/// Attention layer kinds, as in Hugging Face's `config.layer_types`.
inline constexpr const char* kFullAttention = "full_attention";
inline constexpr const char* kSlidingAttention = "sliding_attention";

/// Mixture-of-experts fields (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE, GLM-4.5); num_experts 0 = a dense model.
struct TORCHPATCH_API MoeConfig {
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;       ///< top-k
  int64_t moe_intermediate_size = 0;     ///< each expert's width
  int64_t shared_expert_intermediate_size = 0;  ///< 0 = no shared expert (Qwen3-MoE)
  bool norm_topk_prob = false;           ///< renormalise the top-k probabilities to sum to 1
  int64_t decoder_sparse_step = 1;       ///< layer i is sparse when (i + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;  ///< ... and i is not listed here
  double router_aux_loss_coef = 0.001;
  /// Layers below this one are dense (GLM-4.5, DeepSeek-V3: `first_k_dense_replace`).
  int64_t first_k_dense_replace = 0;
  // The DeepSeek-style router (nn::GroupedTopKRouter): experts in `n_group` groups, the best
  // `topk_group` groups by their two best scores searched, chosen weights times routed_scaling_factor.
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  /// GPT-OSS's clamped SwiGLU (nn::ClampedSwigluExperts): gate clamped above, up on both sides (`swiglu_limit`).
  double swiglu_limit = 7.0;
  /// How the built-in experts run: "grouped" (the default) or "eager"; `implementation` is the same, resolved.
  std::string experts_implementation = "grouped";
  nn::ExpertsImplementation implementation = nn::ExpertsImplementation::kGrouped;

  /// Whether decoder layer `layer_idx` has a sparse block.
  bool is_sparse_layer(int64_t layer_idx) const;
};

/// The fields the transformer families share (vocabulary, widths, layers, heads, activation,
/// positions, padding, tying), named as the decoder families name them. BERT reads the shared ones
/// from here and its own from its FamilyFields.
struct TORCHPATCH_API DecoderConfig {
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;
  int64_t head_dim = 128;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  std::string hidden_act = "silu";
  nn::Activation activation = nn::Activation::kSilu;  ///< hidden_act, resolved
  bool attention_bias = false;  ///< Llama/Mistral: bias on q/k/v/o together
  bool qkv_bias = false;        ///< bias on q/k/v (Qwen2: always; Llama: attention_bias)
  bool o_bias = false;          ///< bias on o_proj (Llama: attention_bias)
  bool mlp_bias = false;
  bool tie_word_embeddings = false;
  std::optional<int64_t> pad_token_id;
  std::vector<int64_t> eos_token_ids;  ///< from `eos_token_id` (a number or a list)
  RopeParameters rope;
  /// RoPE of the sliding layers where it differs from `rope` (Gemma 3's local base): v5's per-layer-type
  /// `rope_parameters` {"full_attention": ..., "sliding_attention": ...}; none = `rope` everywhere.
  std::optional<RopeParameters> sliding_rope;
  /// Keys a sliding layer attends to, itself included (Mistral; Qwen2 when use_sliding_window).
  std::optional<int64_t> sliding_window;
  /// One entry per layer: kFullAttention or kSlidingAttention.
  std::vector<std::string> layer_types;
  /// Per-head RMSNorm of queries and keys before RoPE (Qwen3).
  bool qk_norm = false;
  MoeConfig moe;

  /// Longest sequence the positions support: max_position_embeddings; times `factor` for linear
  /// RoPE; original_max_position_embeddings times `factor` for yarn and llama3 when larger; no limit
  /// for dynamic NTK, which adapts to any length.
  int64_t max_positions() const;
  /// The limit for messages: "256: max_position_embeddings 256, and rope_type 'default' does not
  /// stretch it"; with `rotary` false (learned absolute positions) "max_position_embeddings 512".
  std::string position_limit(bool rotary = true) const;

  /// At least how many parameters a model of this config has (embeddings, attention and MLP or expert
  /// matrices; as a double, so absurd sizes do not overflow). Checked against a checkpoint's tensors
  /// and the machine's memory before anything is allocated.
  double parameter_lower_bound() const;
  /// The largest term of parameter_lower_bound(), with the fields that make it ("the embeddings,
  /// vocab_size 1000000000000 x hidden_size 64"): what a refusal of the model's size names.
  std::string largest_size_term() const;

  /// What the rotary embedding needs of this config.
  operator nn::RopeOptions() const { return {rope, head_dim, max_position_embeddings}; }
};

/// A family's own typed fields, beyond DecoderConfig (BERT's token types, Gemma2's soft-capping, ...).
struct TORCHPATCH_API FamilyFields {
  virtual ~FamilyFields();
  /// Writes the fields back into a config.json object.
  virtual void to_json(nlohmann::json& j) const {}
  /// Whether config.json holds the decoder-only fields (heads of keys/values, RMSNorm eps, RoPE).
  virtual bool has_decoder_fields() const { return true; }
};

/// BERT's own fields (hf-semantics 5.6).
struct TORCHPATCH_API BertConfig : FamilyFields {
  int64_t type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
  bool is_decoder = false;           ///< causal self-attention
  bool add_cross_attention = false;  ///< a cross-attention block in every layer (needs is_decoder)

  void to_json(nlohmann::json& j) const override;
  bool has_decoder_fields() const override { return false; }
};

class FamilyRegistry;
struct Family;

/// A model's configuration: its `model_type`, the typed fields the built-in modules use, and the raw
/// JSON so replacements can read any field they need. Parsed by the family of `model_type`.
struct TORCHPATCH_API ModelConfig : Config {
  DecoderConfig decoder;
  /// The family's own fields; null when it has none.
  std::shared_ptr<const FamilyFields> fields;
  /// The family that read it (from_json sets it): what a plugin asks for the family's classes and
  /// parallel plan, instead of keeping a list of family names. Null for a config parsed directly.
  std::shared_ptr<const Family> family;

  /// The family's fields as `T`; ConfigError when the family has none of that type.
  template <typename T>
  const T& family_fields() const {
    if (const auto* typed = dynamic_cast<const T*>(fields.get())) return *typed;
    throw ConfigError("config of model_type '" + model_type + "' has no " + typeid(T).name() + " fields");
  }
  /// BERT's fields (ConfigError for another family).
  const BertConfig& bert() const { return family_fields<BertConfig>(); }

  /// Parses a config.json object with the family of its `model_type` in `families` (nullptr: the
  /// process-wide ones), which fills Hugging Face's defaults. Throws ConfigError naming the field and
  /// `source` (a file name) on bad input.
  static ModelConfig from_json(const nlohmann::json& json, const std::string& source = "config",
                               const FamilyRegistry* families = nullptr);

  /// Reads and parses `dir/config.json` (or a config file given directly). `source`, when given, names
  /// the file in messages (`path` may be a checkpoint::DirectoryHandle path).
  static ModelConfig from_file(const std::filesystem::path& path, const FamilyRegistry* families = nullptr,
                               const std::string& source = {});

  /// Serialises back to a config.json object (the raw fields with the typed ones written over them).
  nlohmann::json to_json() const;
};

/// How a decoder family reads the shared fields: its defaults and the rules that differ by family.
struct TORCHPATCH_API DecoderTraits {
  /// Which layers slide over a window (when the config has one).
  enum class SlidingLayers {
    kNone,           ///< Llama: no sliding window
    kAll,            ///< Mistral: every layer when `sliding_window` is set
    kFromMaxWindow,  ///< Qwen2: `use_sliding_window`, then `layer_types` or layers >= `max_window_layers`
    kAllWhenUsed,    ///< Qwen3-MoE: every layer when `use_sliding_window`
    kEvenLayers,     ///< Gemma2: layers 0, 2, 4, ... (`sliding_window` always on)
    kPattern         ///< Gemma 3: `layer_types`, else all but every `sliding_window_pattern`-th layer (always on)
  };
  /// Where attention and MLP biases come from.
  enum class Biases {
    kFromConfig,  ///< Llama: `attention_bias` (q/k/v/o) and `mlp_bias`
    kNone,        ///< Mistral: never
    kQkvOnly,     ///< Qwen2: q/k/v always, o and the MLP never
    kQkvFromConfig  ///< GLM-4.5: q/k/v from `attention_bias`, o and the MLP never
  };
  DecoderConfig defaults;
  SlidingLayers sliding = SlidingLayers::kNone;
  Biases biases = Biases::kFromConfig;
  bool moe = false;  ///< reads the MoeConfig fields
  /// head_dim defaults to defaults.head_dim (Gemma), not hidden_size / num_attention_heads.
  bool fixed_head_dim = false;
  /// The config field naming the MLP activation ("hidden_act"; Gemma: "hidden_activation").
  std::string activation_field = "hidden_act";
  /// kPattern without `layer_types` or `sliding_window_pattern`: every this-many-th layer is full.
  int64_t sliding_window_pattern = 6;
  /// The config field giving each expert's width ("moe_intermediate_size"; Mixtral: "intermediate_size").
  std::string expert_width_field = "moe_intermediate_size";
};

/// The shared fields of `json`, read as `traits` say (a family's parser starts here).
TORCHPATCH_API ModelConfig parse_decoder_config(const nlohmann::json& json, const std::string& source,
                                                const DecoderTraits& traits);

}  // namespace torchpatch
