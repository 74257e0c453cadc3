// Model configuration: the parsed config.json, with Hugging Face's defaults per family filled in.
#pragma once

#include "torchpatch/export.h"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace torchpatch {

/// Rotary embedding parameters after the legacy `rope_theta` / `rope_scaling` fields were merged.
struct TORCHPATCH_API RopeParameters {
  std::string rope_type = "default";  ///< "default", "linear", "dynamic", "llama3" or "yarn"
  double theta = 10000.0;
  double factor = 1.0;  ///< context extension factor (linear, dynamic, llama3, yarn)
  double low_freq_factor = 1.0;   ///< llama3
  double high_freq_factor = 4.0;  ///< llama3
  int64_t original_max_position_embeddings = 0;  ///< llama3 (required), yarn (optional); 0 = not given
  double partial_rotary_factor = 1.0;
  // yarn
  std::optional<double> attention_factor;  ///< overrides the computed cos/sin scaling
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  bool truncate = true;  ///< round the correction range to whole dimensions
};

/// Attention layer kinds, as in Hugging Face's `config.layer_types`.
inline constexpr const char* kFullAttention = "full_attention";
inline constexpr const char* kSlidingAttention = "sliding_attention";

/// Mixture-of-experts fields (Qwen2-MoE, Qwen3-MoE); num_experts 0 = a dense model.
struct TORCHPATCH_API MoeConfig {
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;       ///< top-k
  int64_t moe_intermediate_size = 0;     ///< each expert's width
  int64_t shared_expert_intermediate_size = 0;  ///< 0 = no shared expert (Qwen3-MoE)
  bool norm_topk_prob = false;           ///< renormalise the top-k probabilities to sum to 1
  int64_t decoder_sparse_step = 1;       ///< layer i is sparse when (i + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;  ///< ... and i is not listed here
  double router_aux_loss_coef = 0.001;
  /// How the built-in experts run: "grouped" (tokens gathered per chosen expert, the default) or
  /// "eager" (Hugging Face's reference loop over experts).
  std::string experts_implementation = "grouped";

  /// Whether decoder layer `layer_idx` has a sparse block.
  bool is_sparse_layer(int64_t layer_idx) const;
};

/// The fields every family here shares (vocabulary, widths, layers, heads, activation, positions,
/// padding, tying), named for the decoder-only families (Llama, Mistral, Qwen2, the MoE families)
/// whose other fields it also holds. BERT reads the shared ones from here and its own from BertConfig.
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
  bool attention_bias = false;  ///< Llama/Mistral: bias on q/k/v/o together
  bool qkv_bias = false;        ///< bias on q/k/v (Qwen2: always; Llama: attention_bias)
  bool o_bias = false;          ///< bias on o_proj (Llama: attention_bias)
  bool mlp_bias = false;
  bool tie_word_embeddings = false;
  std::optional<int64_t> pad_token_id;
  std::vector<int64_t> eos_token_ids;  ///< from `eos_token_id` (a number or a list)
  RopeParameters rope;
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
};

/// BERT's own fields (hf-semantics 5.6).
struct TORCHPATCH_API BertConfig {
  int64_t type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
  bool is_decoder = false;           ///< causal self-attention
  bool add_cross_attention = false;  ///< a cross-attention block in every layer (needs is_decoder)
};

/// A model's configuration: its `model_type`, the typed fields the built-in modules use, and the raw
/// JSON so replacements can read any field they need.
struct TORCHPATCH_API ModelConfig {
  std::string model_type;
  DecoderConfig decoder;
  BertConfig bert;  ///< model_type "bert" only
  nlohmann::json raw = nlohmann::json::object();

  /// Parses a config.json object; fills Hugging Face's defaults for `model_type`.
  /// Throws ConfigError naming the field and `source` (a file name, for messages) on bad input.
  static ModelConfig from_json(const nlohmann::json& json, const std::string& source = "config");

  /// Reads and parses `dir/config.json` (or a config file given directly).
  static ModelConfig from_file(const std::filesystem::path& path);

  /// Serialises back to a config.json object (the raw fields with the typed ones written over them).
  nlohmann::json to_json() const;
};

}  // namespace torchpatch
