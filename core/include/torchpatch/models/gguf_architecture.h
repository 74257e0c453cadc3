// How a family reads llama.cpp's GGUF files: which `general.architecture` it answers to, how the
// file's hyperparameters become its config.json, and how llama.cpp's tensor names become Hugging
// Face's. Each family registers its own (Family::gguf); the shared decoder part is here.
#pragma once

#include "torchpatch/export.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchpatch/checkpoint/gguf.h"

namespace torchpatch {

struct MoeConfig;

/// Typed reads of a GGUF file's metadata; every failure is a ConfigError naming the file and key.
/// Keys without a dot are the architecture's own (`block_count` reads `llama.block_count`).
class TORCHPATCH_API GgufMetadata {
 public:
  explicit GgufMetadata(const checkpoint::GgufFile& file);
  const checkpoint::GgufFile& file() const { return file_; }
  /// general.architecture.
  const std::string& architecture() const { return arch_; }
  /// The full key of `key` (the architecture's prefix added to a key without a dot).
  std::string full(const std::string& key) const;
  bool has(const std::string& key) const;
  /// The value of `key` (as `full` names it), nullptr when the file has none: for arrays.
  const checkpoint::GgufValue* find(const std::string& key) const { return value(key); }
  int64_t integer(const std::string& key) const;
  std::optional<int64_t> integer_or(const std::string& key) const;
  double number(const std::string& key) const;
  std::optional<double> number_or(const std::string& key) const;
  std::optional<std::string> text_or(const std::string& key) const;
  std::optional<bool> boolean_or(const std::string& key) const;
  /// A ConfigError "FILE: metadata 'KEY': CAUSE".
  [[noreturn]] void fail(const std::string& key, const std::string& cause) const;

 private:
  const checkpoint::GgufValue* value(const std::string& key) const;
  const checkpoint::GgufFile& file_;
  std::string arch_;
};

/// How one GGUF tensor becomes a Hugging Face one.
enum class GgufTensorTransform {
  kNone,
  /// llama.cpp's Llama converter permutes the rows of q_proj (by num_attention_heads) and k_proj (by
  /// num_key_value_heads) from Hugging Face's rotate-half order to interleaved pairs; loading undoes it.
  kUnpermuteQ,
  kUnpermuteK,
  /// llama.cpp's Gemma converters store each RMSNorm weight w as 1 + w (Gemma's norm multiplies by
  /// 1 + weight; llama.cpp's by the weight); loading subtracts 1 and saving adds it back. For a value
  /// y the converter computed as 1 + w from a float32 w, y - 1 is exact in float32, so saving gives
  /// the file's bytes back; the loaded w can differ from the original checkpoint's in its lowest bits
  /// (1 + w rounded them away), while 1 + w, what the norm multiplies by, is the file's value exactly.
  kUnitOffset,
  /// llama.cpp's DeepSeek-2 converter splits multi-head latent attention's kv_b_proj [H (nope + v),
  /// kv_lora] into two tensors: `gguf` (attn_k_b, each head's key rows transposed: [H, kv_lora, nope])
  /// and GgufTensorName::second (attn_v_b, [H, v, kv_lora]); loading joins them, saving splits again.
  kJoinMlaKvB,
  /// A stacked experts tensor the hub holds whole with its last two dimensions swapped (GPT-OSS's
  /// down_proj [E, I, H]; the file's ffn_down_exps is [E, H, I]).
  kTransposeStacked,
  /// GPT-OSS's fused gate_up_proj [E, H, 2I], gate and up interleaved along the last dimension, from
  /// `gguf` (ffn_gate_exps [E, I, H]) and `second` (ffn_up_exps [E, I, H]); split again on saving.
  kJoinInterleavedTransposed,
  /// Its bias gate_up_proj_bias [E, 2I], interleaved from `gguf` and `second` [E, I].
  kJoinInterleaved,
};

/// One naming rule: `gguf` and `hub` are names where `{}` stands for the layer number.
struct TORCHPATCH_API GgufTensorName {
  std::string gguf;  ///< e.g. "blk.{}.attn_q.weight"
  /// e.g. "model.layers.{}.self_attn.q_proj.weight". A `*` segment stands for the expert number
  /// ("model.layers.{}.mlp.experts.*.gate_proj.weight"): llama.cpp stacks a layer's experts in one
  /// tensor [E, ...] (blk.N.ffn_gate_exps), which is E hub tensors, one per expert, as the hub
  /// checkpoints hold them (the family's conversion fuses them as its experts module needs).
  std::string hub;
  GgufTensorTransform transform = GgufTensorTransform::kNone;
  /// The weight of a Linear patch point (a projection): held as the file's blocks where a loaded
  /// quantization method multiplies its type (runtime/gguf_model.h). Stacked experts never are:
  /// they load as float32.
  bool projection = false;
  /// The second GGUF tensor the hub tensor is made of, `{}` for the layer (the kJoin* transforms);
  /// empty for one.
  std::string second = {};
  /// Whether `hub` has the `*` of stacked experts.
  bool stacks_experts() const { return hub.find(".*.") != std::string::npos; }
};

struct TORCHPATCH_API GgufArchitecture {
  /// The general.architecture values the family reads (llama.cpp writes Mistral's as "llama").
  std::vector<std::string> names;
  /// Whether the family reads this file of one of `names`; empty: every one. Where two families answer
  /// to one architecture (llama.cpp's converter writes Llama and Mixtral both as "llama"), the file's
  /// metadata says which (FamilyRegistry::find_gguf takes the family that accepts it).
  std::function<bool(const GgufMetadata&)> accepts;
  /// config.json from the metadata (gguf_decoder_config reads the keys every decoder has).
  std::function<nlohmann::json(const GgufMetadata&)> config;
  /// Tensor names, llama.cpp's to Hugging Face's (gguf_decoder_tensor_names for the usual ones).
  std::vector<GgufTensorName> tensors;
  /// The metadata llama.cpp reads, from config.json (what saving as GGUF writes; the first of `names`
  /// is the architecture written). ConfigError for a config llama.cpp's architecture cannot express.
  std::function<std::vector<std::pair<std::string, checkpoint::GgufValue>>(const nlohmann::json& config)> metadata;
};

/// The architecture of a decoder on the usual names and keys: general.architecture `arch`, read as
/// `model_type` / `causal_lm`; `permuted_qk` for llama.cpp's Llama converter's q/k row order.
TORCHPATCH_API GgufArchitecture gguf_decoder_architecture(const std::string& arch, const std::string& model_type,
                                                          const std::string& causal_lm, bool permuted_qk);

/// The inverse of gguf_decoder_config: the keys llama.cpp reads for architecture `arch`, from config.json.
/// `activation`: the MLP activation llama.cpp's architecture runs (a config with another is refused).
TORCHPATCH_API std::vector<std::pair<std::string, checkpoint::GgufValue>> gguf_decoder_metadata(
    const std::string& arch, const nlohmann::json& config, const std::string& activation = "silu");

/// The RoPE parameters of config.json's full-attention layers: `rope_scaling` (v4), else v5's
/// `rope_parameters` (its `full_attention` entry where it has one per layer type); null for none.
TORCHPATCH_API nlohmann::json gguf_full_attention_rope(const nlohmann::json& config);

/// Which layers slide in a file whose attention.sliding_window is set, read as llama.cpp's
/// load_swa_pattern reads it: attention.sliding_window_pattern as one BOOL a layer, or as N (every
/// layer but each N-th slides; 0: every layer), else `default_pattern` (the architecture's, e.g.
/// Gemma 3's 6). Hugging Face's `layer_types`: "sliding_attention" / "full_attention" per layer.
TORCHPATCH_API nlohmann::json gguf_layer_types(const GgufMetadata& metadata, int64_t layers, int64_t default_pattern);

/// The attention.sliding_window_pattern to write for `layer_types`: one BOOL a layer, or none where
/// they are what llama.cpp assumes without the key (`default_pattern`), as its converter leaves it out.
TORCHPATCH_API std::optional<checkpoint::GgufValue> gguf_sliding_pattern(const std::vector<std::string>& layer_types,
                                                                        int64_t default_pattern);

/// config.json of a decoder from the keys llama.cpp writes for every one: embedding_length,
/// feed_forward_length, block_count, attention.head_count(_kv), context_length,
/// attention.layer_norm_rms_epsilon, rope.freq_base, attention.key_length, the vocabulary's size
/// and special tokens; `tie_word_embeddings` when the file has no output.weight.
TORCHPATCH_API nlohmann::json gguf_decoder_config(const GgufMetadata& metadata, const std::string& model_type,
                                                  const std::string& causal_lm);

/// llama.cpp's names of the usual decoder's tensors (embeddings, norms, q/k/v/o with biases and q/k
/// norms, gate/up/down), Hugging Face's Llama layout; `permuted_qk` marks q and k as permuted.
TORCHPATCH_API std::vector<GgufTensorName> gguf_decoder_tensor_names(bool permuted_qk);

/// The usual names for a decoder with norms after its blocks (Gemma 2 and 3, OLMo 2):
/// post_attention_layernorm is blk.N.post_attention_norm, post_feedforward_layernorm blk.N.post_ffw_norm,
/// and Gemma's pre_feedforward_layernorm takes blk.N.ffn_norm.
TORCHPATCH_API std::vector<GgufTensorName> gguf_post_norm_tensor_names(bool permuted_qk);

/// llama.cpp's names of a sparse block's router and stacked experts (blk.N.ffn_gate_inp,
/// ffn_gate_exps / ffn_up_exps / ffn_down_exps, each [E, out, in]) in the hub layout of `block`
/// ("mlp": model.layers.N.mlp.gate, mlp.experts.E.gate_proj / up_proj / down_proj; Mixtral names its
/// block and projections otherwise).
TORCHPATCH_API std::vector<GgufTensorName> gguf_expert_tensor_names(const std::string& block = "mlp",
                                                                    const std::string& gate = "gate_proj",
                                                                    const std::string& up = "up_proj",
                                                                    const std::string& down = "down_proj");

/// config.json's expert fields from llama.cpp's keys: num_experts (expert_count) and
/// num_experts_per_tok (expert_used_count), both required; norm_topk_prob as `normalized`, since
/// llama.cpp's graph of the architecture fixes it and no key says it.
TORCHPATCH_API void gguf_moe_config(const GgufMetadata& metadata, nlohmann::json& config, bool normalized);

/// The inverse: expert_count and expert_used_count for architecture `arch`. ConfigError (naming
/// `source` and the field) for what llama.cpp's graph cannot run: a dense layer among the sparse
/// ones (decoder_sparse_step, mlp_only_layers, first_k_dense_replace), norm_topk_prob other than
/// `normalized`.
TORCHPATCH_API std::vector<std::pair<std::string, checkpoint::GgufValue>> gguf_moe_metadata(
    const std::string& arch, const MoeConfig& moe, bool normalized, const std::string& source);

/// config.json's fields of the DeepSeek-style MoE (GLM-4.5, DeepSeek-V3: grouped top-k, shared experts,
/// dense first layers) from llama.cpp's keys, its defaults where absent: n_routed_experts,
/// num_experts_per_tok, moe_intermediate_size, n_shared_experts, first_k_dense_replace,
/// routed_scaling_factor, norm_topk_prob, n_group, topk_group. (The router's scoring is the family's.)
TORCHPATCH_API void gguf_grouped_moe_config(const GgufMetadata& metadata, nlohmann::json& config);

/// The inverse for architecture `arch`, with expert_gating_func 2 (sigmoid). ConfigError naming
/// `source` for what llama.cpp's graph cannot run: dense layers other than the first ones, shared
/// experts that are not whole experts.
TORCHPATCH_API std::vector<std::pair<std::string, checkpoint::GgufValue>> gguf_grouped_moe_metadata(
    const std::string& arch, const MoeConfig& moe, const std::string& source);

/// Marks every RMSNorm weight of `names` (a hub name ending in "norm.weight", the converter's test)
/// as stored plus one (GgufTensorTransform::kUnitOffset): llama.cpp's Gemma converters.
TORCHPATCH_API void gguf_unit_offset_norms(std::vector<GgufTensorName>& names);

}  // namespace torchpatch
