// The GGUF keys and tensor names every llama.cpp decoder shares.
#include "torchpatch/models/gguf_architecture.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/models/config.h"
#include "torchpatch/printable.h"

namespace torchpatch {

using checkpoint::GgufType;
using checkpoint::GgufValue;

GgufMetadata::GgufMetadata(const checkpoint::GgufFile& file) : file_(file) {
  const auto* arch = file.find_value("general.architecture");
  if (arch == nullptr) fail("general.architecture", "missing: the file does not say which model it holds");
  if (arch->type != GgufType::STRING) fail("general.architecture", fmt::format("a {}, not a STRING", gguf_type_name(arch->type)));
  arch_ = arch->text;
}

std::string GgufMetadata::full(const std::string& key) const {
  // "block_count" and "attention.head_count" are the architecture's; general.* and tokenizer.* keys
  // and keys already prefixed are whole.
  const bool whole = key.rfind("general.", 0) == 0 || key.rfind("tokenizer.", 0) == 0 || key.rfind(arch_ + ".", 0) == 0;
  return whole ? key : arch_ + "." + key;
}

void GgufMetadata::fail(const std::string& key, const std::string& cause) const {
  throw ConfigError(fmt::format("{}: metadata '{}': {}", file_.path().string(), printable(key), cause));
}

const GgufValue* GgufMetadata::value(const std::string& key) const { return file_.find_value(full(key)); }

bool GgufMetadata::has(const std::string& key) const { return value(key) != nullptr; }

std::optional<int64_t> GgufMetadata::integer_or(const std::string& key) const {
  const auto* v = value(key);
  if (v == nullptr) return std::nullopt;
  if (v->type == GgufType::ARRAY) {
    fail(full(key), "an array (a value per layer), which torchpatch reads only where the family's config has one");
  }
  const auto i = v->as_int();
  if (!i) fail(full(key), fmt::format("a {}, not an integer that fits in 63 bits", gguf_type_name(v->type)));
  return i;
}

int64_t GgufMetadata::integer(const std::string& key) const {
  const auto i = integer_or(key);
  if (!i) fail(full(key), "missing");
  return *i;
}

std::optional<double> GgufMetadata::number_or(const std::string& key) const {
  const auto* v = value(key);
  if (v == nullptr) return std::nullopt;
  const auto n = v->as_number();
  if (!n || !std::isfinite(*n)) fail(full(key), fmt::format("a {}, not a finite number", gguf_type_name(v->type)));
  return n;
}

double GgufMetadata::number(const std::string& key) const {
  const auto n = number_or(key);
  if (!n) fail(full(key), "missing");
  return *n;
}

std::optional<std::string> GgufMetadata::text_or(const std::string& key) const {
  const auto* v = value(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufType::STRING) fail(full(key), fmt::format("a {}, not a STRING", gguf_type_name(v->type)));
  return v->text;
}

std::optional<bool> GgufMetadata::boolean_or(const std::string& key) const {
  const auto* v = value(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufType::BOOL) fail(full(key), fmt::format("a {}, not a BOOL", gguf_type_name(v->type)));
  return v->boolean;
}

namespace {

// The vocabulary's size: the architecture's vocab_size, else the tokenizer's token count, else the
// embedding's rows.
int64_t vocab_size(const GgufMetadata& m) {
  if (const auto n = m.integer_or("vocab_size")) return *n;
  if (const auto* tokens = m.file().find_value("tokenizer.ggml.tokens"); tokens && tokens->type == GgufType::ARRAY) {
    return static_cast<int64_t>(tokens->array.size());
  }
  if (const auto* embed = m.file().find("token_embd.weight"); embed && embed->dims.size() == 2) return embed->dims[1];
  m.fail(m.full("vocab_size"), "missing, and the file has neither tokenizer.ggml.tokens nor token_embd.weight");
}

// YaRN as llama.cpp reads it: factor, the original context, the betas (32 and 1 by default); the
// keys that scale attention besides (DeepSeek's log multiplier, an explicit attention factor) are not
// read yet, and refused.
nlohmann::json gguf_yarn(const GgufMetadata& m) {
  for (const char* key : {"rope.scaling.yarn_log_multiplier", "rope.scaling.yarn_attn_factor", "rope.scaling.yarn_ext_factor",
                          "rope.scaling.attn_factor"}) {
    if (m.has(key)) m.fail(m.full(key), "a YaRN parameter torchpatch does not read from GGUF files yet");
  }
  nlohmann::json y{{"rope_type", "yarn"},
                   {"factor", m.number("rope.scaling.factor")},
                   {"beta_fast", m.number_or("rope.scaling.yarn_beta_fast").value_or(32.0)},
                   {"beta_slow", m.number_or("rope.scaling.yarn_beta_slow").value_or(1.0)}};
  if (const auto original = m.integer_or("rope.scaling.original_context_length")) {
    y["original_max_position_embeddings"] = *original;
  }
  return y;
}

}  // namespace

nlohmann::json gguf_decoder_config(const GgufMetadata& m, const std::string& model_type, const std::string& causal_lm) {
  nlohmann::json c{{"architectures", {causal_lm}},
                   {"model_type", model_type},
                   {"vocab_size", vocab_size(m)},
                   {"hidden_size", m.integer("embedding_length")},
                   {"intermediate_size", m.integer("feed_forward_length")},
                   {"num_hidden_layers", m.integer("block_count")},
                   {"num_attention_heads", m.integer("attention.head_count")},
                   {"max_position_embeddings", m.integer("context_length")},
                   {"rms_norm_eps", m.number("attention.layer_norm_rms_epsilon")},
                   {"rope_theta", m.number_or("rope.freq_base").value_or(10000.0)},
                   {"tie_word_embeddings", m.file().find("output.weight") == nullptr},
                   {"hidden_act", "silu"}};
  c["num_key_value_heads"] = m.integer_or("attention.head_count_kv").value_or(c["num_attention_heads"].get<int64_t>());
  const auto heads = c["num_attention_heads"].get<int64_t>();
  if (const auto key_length = m.integer_or("attention.key_length")) {
    if (heads > 0 && *key_length != c["hidden_size"].get<int64_t>() / heads) c["head_dim"] = *key_length;
  }
  if (const auto scaling = m.text_or("rope.scaling.type"); scaling && *scaling != "none") {
    if (*scaling == "linear") {
      c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", m.number("rope.scaling.factor")}};
    } else if (*scaling == "yarn") {
      c["rope_scaling"] = gguf_yarn(m);
    } else {
      m.fail(m.full("rope.scaling.type"),
             fmt::format("'{}' RoPE scaling is not read from GGUF files yet (linear and yarn are)", *scaling));
    }
  }
  if (m.file().find("rope_freqs.weight") != nullptr) {
    throw ConfigError(fmt::format("{}: tensor 'rope_freqs.weight': the file scales its RoPE frequencies by a tensor "
                                  "(Llama 3.1's rope_type 'llama3'), which torchpatch does not read from GGUF files yet",
                                  m.file().path().string()));
  }
  for (const auto& [key, field] : {std::pair{"tokenizer.ggml.bos_token_id", "bos_token_id"},
                                   std::pair{"tokenizer.ggml.eos_token_id", "eos_token_id"},
                                   std::pair{"tokenizer.ggml.padding_token_id", "pad_token_id"}}) {
    if (const auto id = m.integer_or(key)) c[field] = *id;
  }
  return c;
}

std::vector<GgufTensorName> gguf_decoder_tensor_names(bool permuted_qk) {
  using T = GgufTensorTransform;
  const auto q = permuted_qk ? T::kUnpermuteQ : T::kNone;
  const auto k = permuted_qk ? T::kUnpermuteK : T::kNone;
  constexpr bool kProjection = true;
  return {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight", T::kNone, kProjection},
      {"blk.{}.attn_norm.weight", "model.layers.{}.input_layernorm.weight"},
      {"blk.{}.attn_q.weight", "model.layers.{}.self_attn.q_proj.weight", q, kProjection},
      {"blk.{}.attn_q.bias", "model.layers.{}.self_attn.q_proj.bias", q},
      {"blk.{}.attn_k.weight", "model.layers.{}.self_attn.k_proj.weight", k, kProjection},
      {"blk.{}.attn_k.bias", "model.layers.{}.self_attn.k_proj.bias", k},
      {"blk.{}.attn_v.weight", "model.layers.{}.self_attn.v_proj.weight", T::kNone, kProjection},
      {"blk.{}.attn_v.bias", "model.layers.{}.self_attn.v_proj.bias"},
      {"blk.{}.attn_output.weight", "model.layers.{}.self_attn.o_proj.weight", T::kNone, kProjection},
      {"blk.{}.attn_output.bias", "model.layers.{}.self_attn.o_proj.bias"},
      {"blk.{}.attn_q_norm.weight", "model.layers.{}.self_attn.q_norm.weight"},
      {"blk.{}.attn_k_norm.weight", "model.layers.{}.self_attn.k_norm.weight"},
      {"blk.{}.ffn_norm.weight", "model.layers.{}.post_attention_layernorm.weight"},
      {"blk.{}.ffn_gate.weight", "model.layers.{}.mlp.gate_proj.weight", T::kNone, kProjection},
      {"blk.{}.ffn_up.weight", "model.layers.{}.mlp.up_proj.weight", T::kNone, kProjection},
      {"blk.{}.ffn_down.weight", "model.layers.{}.mlp.down_proj.weight", T::kNone, kProjection},
  };
}

std::vector<GgufTensorName> gguf_post_norm_tensor_names(bool permuted_qk) {
  auto names = gguf_decoder_tensor_names(permuted_qk);
  // The usual blk.N.ffn_norm is the norm before the MLP: Gemma's pre_feedforward_layernorm here.
  for (auto& n : names) {
    if (n.gguf == "blk.{}.ffn_norm.weight") n.hub = "model.layers.{}.pre_feedforward_layernorm.weight";
  }
  names.push_back({"blk.{}.post_attention_norm.weight", "model.layers.{}.post_attention_layernorm.weight"});
  names.push_back({"blk.{}.post_ffw_norm.weight", "model.layers.{}.post_feedforward_layernorm.weight"});
  return names;
}

std::vector<GgufTensorName> gguf_expert_tensor_names(const std::string& block, const std::string& gate,
                                                     const std::string& up, const std::string& down) {
  const auto hub = "model.layers.{}." + block;
  return {
      {"blk.{}.ffn_gate_inp.weight", hub + ".gate.weight"},
      {"blk.{}.ffn_gate_exps.weight", hub + ".experts.*." + gate + ".weight"},
      {"blk.{}.ffn_up_exps.weight", hub + ".experts.*." + up + ".weight"},
      {"blk.{}.ffn_down_exps.weight", hub + ".experts.*." + down + ".weight"},
  };
}

void gguf_grouped_moe_config(const GgufMetadata& m, nlohmann::json& c) {
  c["n_routed_experts"] = m.integer("expert_count");
  c["num_experts_per_tok"] = m.integer("expert_used_count");
  c["moe_intermediate_size"] = m.integer("expert_feed_forward_length");
  c["n_shared_experts"] = m.integer("expert_shared_count");
  c["first_k_dense_replace"] = m.integer_or("leading_dense_block_count").value_or(0);
  c["routed_scaling_factor"] = m.number_or("expert_weights_scale").value_or(1.0);
  c["norm_topk_prob"] = m.boolean_or("expert_weights_norm").value_or(false);  // llama.cpp's default
  c["n_group"] = m.integer_or("expert_group_count").value_or(1);
  c["topk_group"] = m.integer_or("expert_group_used_count").value_or(1);
}

std::vector<std::pair<std::string, GgufValue>> gguf_grouped_moe_metadata(const std::string& arch, const MoeConfig& moe,
                                                                         const std::string& source) {
  if (moe.decoder_sparse_step != 1 || !moe.mlp_only_layers.empty()) {
    throw ConfigError(fmt::format("{}: dense layers among the sparse ones (decoder_sparse_step {}, mlp_only_layers of "
                                  "{}); llama.cpp's '{}' has dense layers only before the first sparse one "
                                  "(first_k_dense_replace)",
                                  source, moe.decoder_sparse_step, moe.mlp_only_layers.size(), arch));
  }
  if (moe.moe_intermediate_size <= 0 || moe.shared_expert_intermediate_size % moe.moe_intermediate_size != 0) {
    throw ConfigError(fmt::format("{}: shared experts {} wide are not whole experts of moe_intermediate_size {}",
                                  source, moe.shared_expert_intermediate_size, moe.moe_intermediate_size));
  }
  const auto u32 = [](int64_t v) { return GgufValue::of(static_cast<uint32_t>(v)); };
  constexpr int64_t kSigmoidGating = 2;  // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
  return {
      {arch + ".expert_count", u32(moe.num_experts)},
      {arch + ".expert_used_count", u32(moe.num_experts_per_tok)},
      {arch + ".expert_group_count", u32(moe.n_group)},
      {arch + ".expert_group_used_count", u32(moe.topk_group)},
      {arch + ".expert_feed_forward_length", u32(moe.moe_intermediate_size)},
      {arch + ".expert_shared_count", u32(moe.shared_expert_intermediate_size / moe.moe_intermediate_size)},
      {arch + ".leading_dense_block_count", u32(moe.first_k_dense_replace)},
      {arch + ".expert_gating_func", u32(kSigmoidGating)},
      {arch + ".expert_weights_scale", GgufValue::of(static_cast<float>(moe.routed_scaling_factor))},
      {arch + ".expert_weights_norm", GgufValue::of(moe.norm_topk_prob)},
  };
}

void gguf_moe_config(const GgufMetadata& m, nlohmann::json& c, bool normalized) {
  c["num_experts"] = m.integer("expert_count");
  c["num_experts_per_tok"] = m.integer("expert_used_count");
  c["norm_topk_prob"] = normalized;
}

std::vector<std::pair<std::string, GgufValue>> gguf_moe_metadata(const std::string& arch, const MoeConfig& moe,
                                                                 bool normalized, const std::string& source) {
  // llama.cpp's graphs of these architectures run every layer sparse, and renormalize the chosen
  // experts' weights or not as the architecture's original does.
  if (moe.decoder_sparse_step != 1 || !moe.mlp_only_layers.empty() || moe.first_k_dense_replace != 0) {
    throw ConfigError(fmt::format("{}: dense layers among the sparse ones (decoder_sparse_step {}, mlp_only_layers of "
                                  "{}, first_k_dense_replace {}); llama.cpp's '{}' makes every layer sparse",
                                  source, moe.decoder_sparse_step, moe.mlp_only_layers.size(),
                                  moe.first_k_dense_replace, arch));
  }
  if (moe.norm_topk_prob != normalized) {
    throw ConfigError(fmt::format("{}: norm_topk_prob {}; llama.cpp's '{}' always runs it {} and has no key for it",
                                  source, moe.norm_topk_prob, arch, normalized));
  }
  if (moe.num_experts <= 0 || moe.num_experts_per_tok <= 0) {
    throw ConfigError(fmt::format("{}: num_experts {} and num_experts_per_tok {} must be positive for llama.cpp's '{}'",
                                  source, moe.num_experts, moe.num_experts_per_tok, arch));
  }
  return {{arch + ".expert_count", GgufValue::of(static_cast<uint32_t>(moe.num_experts))},
          {arch + ".expert_used_count", GgufValue::of(static_cast<uint32_t>(moe.num_experts_per_tok))}};
}

void gguf_unit_offset_norms(std::vector<GgufTensorName>& names) {
  const std::string suffix = "norm.weight";
  for (auto& n : names) {
    if (n.hub.size() >= suffix.size() && n.hub.compare(n.hub.size() - suffix.size(), suffix.size(), suffix) == 0) {
      n.transform = GgufTensorTransform::kUnitOffset;
    }
  }
}

nlohmann::json gguf_layer_types(const GgufMetadata& m, int64_t layers, int64_t default_pattern) {
  std::vector<bool> sliding(static_cast<size_t>(std::max<int64_t>(layers, 0)));
  const auto* pattern = m.find("attention.sliding_window_pattern");
  if (pattern != nullptr && pattern->type == GgufType::ARRAY) {
    if (pattern->element_type != GgufType::BOOL || static_cast<int64_t>(pattern->array.size()) != layers) {
      m.fail(m.full("attention.sliding_window_pattern"),
             fmt::format("an array of {} {}, where llama.cpp reads one BOOL a layer ({} layers)", pattern->array.size(),
                         gguf_type_name(pattern->element_type), layers));
    }
    for (size_t i = 0; i < sliding.size(); ++i) sliding[i] = pattern->array[i].boolean;
  } else {
    const auto n = m.integer_or("attention.sliding_window_pattern").value_or(default_pattern);
    if (n < 0) m.fail(m.full("attention.sliding_window_pattern"), fmt::format("{}, a negative layer period", n));
    // llama.cpp's set_swa_pattern: all but the last layer of each period of n slide; 0: all slide.
    for (size_t i = 0; i < sliding.size(); ++i) sliding[i] = n == 0 || static_cast<int64_t>(i) % n < n - 1;
  }
  auto types = nlohmann::json::array();
  for (const bool s : sliding) types.push_back(s ? "sliding_attention" : "full_attention");
  return types;
}

std::optional<GgufValue> gguf_sliding_pattern(const std::vector<std::string>& layer_types, int64_t default_pattern) {
  GgufValue flags;
  flags.type = GgufType::ARRAY;
  flags.element_type = GgufType::BOOL;
  bool as_default = true;
  for (size_t i = 0; i < layer_types.size(); ++i) {
    const bool sliding = layer_types[i] == "sliding_attention";
    const auto i64 = static_cast<int64_t>(i);
    as_default = as_default && sliding == (default_pattern == 0 || i64 % default_pattern < default_pattern - 1);
    flags.array.push_back(GgufValue::of(sliding));
  }
  if (as_default) return std::nullopt;
  return flags;
}

nlohmann::json gguf_full_attention_rope(const nlohmann::json& c) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const auto it = c.find(key);
    if (it == c.end() || !it->is_object()) continue;
    return it->contains("full_attention") ? it->at("full_attention") : *it;
  }
  return nullptr;
}

std::vector<std::pair<std::string, GgufValue>> gguf_decoder_metadata(const std::string& arch, const nlohmann::json& c,
                                                                     const std::string& activation) {
  const auto source = fmt::format("{} as GGUF architecture '{}'", c.value("model_type", std::string("model")), arch);
  const auto integer = [&](const char* field) -> uint32_t {
    if (!c.contains(field) || !c[field].is_number_integer() || c[field].get<int64_t>() <= 0 ||
        c[field].get<int64_t>() > std::numeric_limits<uint32_t>::max()) {
      throw ConfigError(fmt::format("{}: config field '{}' is not a positive 32-bit integer", source, field));
    }
    return static_cast<uint32_t>(c[field].get<int64_t>());
  };
  if (c.value("hidden_act", activation) != activation) {
    throw ConfigError(fmt::format("{}: hidden_act '{}' (llama.cpp's architecture runs {})", source,
                                  c.value("hidden_act", std::string()), activation));
  }
  if (c.value("use_sliding_window", false)) {
    throw ConfigError(fmt::format("{}: a sliding window, which llama.cpp's '{}' does not apply", source, arch));
  }
  std::vector<std::pair<std::string, GgufValue>> m{
      {"general.architecture", GgufValue::of(arch)},
      {arch + ".block_count", GgufValue::of(integer("num_hidden_layers"))},
      {arch + ".context_length", GgufValue::of(integer("max_position_embeddings"))},
      {arch + ".embedding_length", GgufValue::of(integer("hidden_size"))},
      {arch + ".feed_forward_length", GgufValue::of(integer("intermediate_size"))},
      {arch + ".attention.head_count", GgufValue::of(integer("num_attention_heads"))},
      {arch + ".attention.head_count_kv", GgufValue::of(integer("num_key_value_heads"))},
      {arch + ".rope.freq_base", GgufValue::of(static_cast<float>(c.value("rope_theta", 10000.0)))},
      {arch + ".attention.layer_norm_rms_epsilon", GgufValue::of(static_cast<float>(c.value("rms_norm_eps", 1e-6)))},
      {arch + ".attention.key_length", GgufValue::of(integer("head_dim"))},
      {arch + ".attention.value_length", GgufValue::of(integer("head_dim"))},
      {arch + ".rope.dimension_count", GgufValue::of(integer("head_dim"))},
      {arch + ".vocab_size", GgufValue::of(integer("vocab_size"))},
  };
  const auto scaling = gguf_full_attention_rope(c);
  const auto type = scaling.is_object() ? scaling.value("rope_type", scaling.value("type", std::string("default"))) : "default";
  if (type == "linear" || type == "yarn") {
    m.emplace_back(arch + ".rope.scaling.type", GgufValue::of(type));
    m.emplace_back(arch + ".rope.scaling.factor", GgufValue::of(static_cast<float>(scaling.value("factor", 1.0))));
  } else if (type != "default") {
    throw ConfigError(fmt::format("{}: rope_type '{}' is not written to GGUF files yet (default, linear and yarn are)",
                                  source, type));
  }
  if (type == "yarn") {
    for (const char* field : {"attention_factor", "mscale", "mscale_all_dim"}) {
      if (scaling.contains(field) && !scaling[field].is_null()) {
        throw ConfigError(fmt::format("{}: YaRN's {} is not written to GGUF files yet", source, field));
      }
    }
    if (!scaling.value("truncate", true)) {
      throw ConfigError(fmt::format("{}: YaRN with truncate false (llama.cpp rounds the correction range to whole "
                                    "dimensions)",
                                    source));
    }
    if (const auto original = scaling.value("original_max_position_embeddings", int64_t{0}); original > 0) {
      m.emplace_back(arch + ".rope.scaling.original_context_length", GgufValue::of(static_cast<uint32_t>(original)));
    }
    m.emplace_back(arch + ".rope.scaling.yarn_beta_fast", GgufValue::of(static_cast<float>(scaling.value("beta_fast", 32.0))));
    m.emplace_back(arch + ".rope.scaling.yarn_beta_slow", GgufValue::of(static_cast<float>(scaling.value("beta_slow", 1.0))));
  }
  for (const auto& [field, key] : {std::pair{"bos_token_id", "tokenizer.ggml.bos_token_id"},
                                   std::pair{"eos_token_id", "tokenizer.ggml.eos_token_id"},
                                   std::pair{"pad_token_id", "tokenizer.ggml.padding_token_id"}}) {
    if (c.contains(field) && c[field].is_number_integer() && c[field].get<int64_t>() >= 0) {
      m.emplace_back(key, GgufValue::of(static_cast<uint32_t>(c[field].get<int64_t>())));
    }
  }
  return m;
}

GgufArchitecture gguf_decoder_architecture(const std::string& arch, const std::string& model_type,
                                           const std::string& causal_lm, bool permuted_qk) {
  GgufArchitecture a;
  a.names = {arch};
  a.config = [=](const GgufMetadata& m) { return gguf_decoder_config(m, model_type, causal_lm); };
  a.tensors = gguf_decoder_tensor_names(permuted_qk);
  a.metadata = [arch](const nlohmann::json& c) { return gguf_decoder_metadata(arch, c); };
  return a;
}

}  // namespace torchpatch
