#include "torchpatch/models/config.h"

#include <fstream>

#include <fmt/format.h>

#include "torchpatch/error.h"
#include "models/families.h"

namespace torchpatch {

namespace {

using nlohmann::json;

// Reads an optional field; absent or null keeps the default, the wrong kind is an error.
class FieldReader {
 public:
  FieldReader(const json& j, const std::string& source) : j_(j), source_(source) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  int64_t integer(const char* key, int64_t fallback) const {
    if (!has(key)) return fallback;
    const auto& v = j_.at(key);
    if (!v.is_number_integer()) fail(key, "an integer", v);
    return v.get<int64_t>();
  }
  int64_t positive(const char* key, int64_t fallback) const {
    const int64_t v = integer(key, fallback);
    if (v <= 0) throw ConfigError(fmt::format("{}: field '{}' must be positive, got {}", source_, key, v));
    return v;
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const auto& v = j_.at(key);
    if (!v.is_number()) fail(key, "a number", v);
    return v.get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const auto& v = j_.at(key);
    if (!v.is_boolean()) fail(key, "a boolean", v);
    return v.get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const auto& v = j_.at(key);
    if (!v.is_string()) fail(key, "a string", v);
    return v.get<std::string>();
  }

 private:
  [[noreturn]] void fail(const char* key, const char* kind, const json& v) const {
    throw ConfigError(fmt::format("{}: field '{}' must be {}, got {}", source_, key, kind, v.dump()));
  }
  const json& j_;
  const std::string& source_;
};

RopeParameters read_rope(const json& j, const std::string& source) {
  FieldReader top(j, source);
  RopeParameters rope;
  rope.theta = top.number("rope_theta", 10000.0);
  rope.partial_rotary_factor = top.number("partial_rotary_factor", 1.0);
  // Legacy `rope_scaling` (v4 config.json) or v5 `rope_parameters`; "type" is accepted for "rope_type".
  const char* key = top.has("rope_scaling") ? "rope_scaling" : top.has("rope_parameters") ? "rope_parameters" : nullptr;
  if (!key) return rope;
  const json& scaling = j.at(key);
  if (!scaling.is_object()) {
    throw ConfigError(fmt::format("{}: field '{}' must be an object, got {}", source, key, scaling.dump()));
  }
  const std::string where = fmt::format("{}: {}", source, key);
  FieldReader r(scaling, where);
  rope.theta = r.number("rope_theta", rope.theta);
  rope.rope_type = r.string("rope_type", r.string("type", "default"));
  rope.factor = r.number("factor", 1.0);
  if (rope.rope_type == "llama3") {
    for (const char* required : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      if (!r.has(required)) {
        throw ConfigError(fmt::format("{}: rope_type 'llama3' needs field '{}'", where, required));
      }
    }
    rope.low_freq_factor = r.number("low_freq_factor", 1.0);
    rope.high_freq_factor = r.number("high_freq_factor", 4.0);
    rope.original_max_position_embeddings = r.positive("original_max_position_embeddings", 8192);
    if (rope.high_freq_factor == rope.low_freq_factor) {
      throw ConfigError(fmt::format("{}: high_freq_factor must differ from low_freq_factor", where));
    }
  }
  return rope;
}

}  // namespace

ModelConfig ModelConfig::from_json(const json& j, const std::string& source) {
  if (!j.is_object()) throw ConfigError(fmt::format("{}: expected a JSON object", source));
  FieldReader f(j, source);
  ModelConfig config;
  config.raw = j;
  if (!f.has("model_type")) throw ConfigError(fmt::format("{}: missing required field 'model_type'", source));
  config.model_type = f.string("model_type", "");
  const DecoderConfig defaults = family_defaults(config.model_type, source);

  DecoderConfig& d = config.decoder;
  d.vocab_size = f.positive("vocab_size", defaults.vocab_size);
  d.hidden_size = f.positive("hidden_size", defaults.hidden_size);
  d.intermediate_size = f.positive("intermediate_size", defaults.intermediate_size);
  d.num_hidden_layers = f.positive("num_hidden_layers", defaults.num_hidden_layers);
  d.num_attention_heads = f.positive("num_attention_heads", defaults.num_attention_heads);
  d.num_key_value_heads = f.positive("num_key_value_heads", d.num_attention_heads);
  if (!f.has("head_dim") && d.hidden_size % d.num_attention_heads != 0) {
    throw ConfigError(fmt::format("{}: hidden_size {} is not divisible by num_attention_heads {} (set head_dim)",
                                  source, d.hidden_size, d.num_attention_heads));
  }
  d.head_dim = f.positive("head_dim", d.hidden_size / d.num_attention_heads);
  if (d.num_attention_heads % d.num_key_value_heads != 0) {
    throw ConfigError(fmt::format("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", source,
                                  d.num_attention_heads, d.num_key_value_heads));
  }
  d.max_position_embeddings = f.positive("max_position_embeddings", defaults.max_position_embeddings);
  d.rms_norm_eps = f.number("rms_norm_eps", defaults.rms_norm_eps);
  d.hidden_act = f.string("hidden_act", defaults.hidden_act);
  d.attention_bias = f.boolean("attention_bias", defaults.attention_bias);
  d.mlp_bias = f.boolean("mlp_bias", defaults.mlp_bias);
  d.tie_word_embeddings = f.boolean("tie_word_embeddings", defaults.tie_word_embeddings);
  if (f.has("pad_token_id")) d.pad_token_id = f.integer("pad_token_id", 0);
  d.rope = read_rope(j, source);
  if (d.rope.partial_rotary_factor <= 0 || d.rope.partial_rotary_factor > 1) {
    throw ConfigError(fmt::format("{}: partial_rotary_factor must be in (0, 1], got {}", source,
                                  d.rope.partial_rotary_factor));
  }
  return config;
}

ModelConfig ModelConfig::from_file(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) throw ConfigError(fmt::format("{}: no such file or directory", path.string()));
  const auto file = std::filesystem::is_directory(path) ? path / "config.json" : path;
  std::ifstream in(file);
  if (!in) {
    throw ConfigError(fmt::format("{}: cannot open config file (a checkpoint directory holds config.json and "
                                  "model.safetensors)",
                                  file.string()));
  }
  json j;
  try {
    in >> j;
  } catch (const json::exception& e) {
    throw ConfigError(fmt::format("{}: not valid JSON: {}", file.string(), e.what()));
  }
  return from_json(j, file.string());
}

json ModelConfig::to_json() const {
  json j = raw;
  j["model_type"] = model_type;
  j["vocab_size"] = decoder.vocab_size;
  j["hidden_size"] = decoder.hidden_size;
  j["intermediate_size"] = decoder.intermediate_size;
  j["num_hidden_layers"] = decoder.num_hidden_layers;
  j["num_attention_heads"] = decoder.num_attention_heads;
  j["num_key_value_heads"] = decoder.num_key_value_heads;
  j["head_dim"] = decoder.head_dim;
  j["max_position_embeddings"] = decoder.max_position_embeddings;
  j["rms_norm_eps"] = decoder.rms_norm_eps;
  j["hidden_act"] = decoder.hidden_act;
  j["attention_bias"] = decoder.attention_bias;
  j["mlp_bias"] = decoder.mlp_bias;
  j["tie_word_embeddings"] = decoder.tie_word_embeddings;
  j["rope_theta"] = decoder.rope.theta;
  return j;
}

}  // namespace torchpatch
