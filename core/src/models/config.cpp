#include "torchpatch/models/config.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/printable.h"
#include "torchpatch/json_file.h"
#include "torchpatch/models/family.h"

namespace torchpatch {

namespace {

using nlohmann::json;

using FieldReader = ConfigReader;

RopeParameters read_rope(const json& j, const std::string& source) {
  FieldReader top(j, source);
  RopeParameters rope;
  rope.theta = top.number("rope_theta", 10000.0);
  rope.partial_rotary_factor = top.number("partial_rotary_factor", 1.0);
  if (!(rope.theta > 0)) throw ConfigError(fmt::format("{}: rope_theta must be positive, got {}", source, rope.theta));
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
  rope.partial_rotary_factor = r.number("partial_rotary_factor", rope.partial_rotary_factor);
  rope.rope_type = r.string("rope_type", r.string("type", "default"));
  auto require = [&](std::initializer_list<const char*> fields) {
    for (const char* field : fields) {
      if (!r.has(field)) {
        throw ConfigError(fmt::format("{}: rope_type '{}' needs field '{}'", where, printable(rope.rope_type, 200), field));
      }
    }
  };
  const auto& type = rope.rope_type;
  static const std::map<std::string, nn::RopeKind> kinds{
      {"default", nn::RopeKind::kDefault}, {"linear", nn::RopeKind::kLinear},  {"dynamic", nn::RopeKind::kDynamic},
      {"llama3", nn::RopeKind::kLlama3},   {"yarn", nn::RopeKind::kYarn},      {"longrope", nn::RopeKind::kLongrope}};
  auto kind = kinds.find(type);
  if (kind == kinds.end()) {
    throw ConfigError(fmt::format(
        "{}: unsupported rope_type '{}' (supported: default, linear, dynamic, llama3, yarn, longrope)", where,
        printable(type, 200)));
  }
  rope.kind = kind->second;
  if (!(rope.theta > 0)) throw ConfigError(fmt::format("{}: rope_theta must be positive, got {}", where, rope.theta));
  if (type == "default") return rope;
  if (type == "longrope") {
    require({"short_factor", "long_factor"});
    rope.short_factor = r.numbers("short_factor");
    rope.long_factor = r.numbers("long_factor");
    // Phi-3 keeps the trained length at the top level; newer configs inside rope_scaling.
    rope.original_max_position_embeddings = r.has("original_max_position_embeddings")
                                                ? r.positive("original_max_position_embeddings", 1)
                                                : top.positive("original_max_position_embeddings", 0 + 1);
    if (!r.has("original_max_position_embeddings") && !top.has("original_max_position_embeddings")) {
      throw ConfigError(fmt::format("{}: rope_type 'longrope' needs field 'original_max_position_embeddings'", where));
    }
    return rope;
  }
  require({"factor"});
  rope.factor = r.number("factor", 1.0);
  if (rope.factor < 1.0) throw ConfigError(fmt::format("{}: factor must be >= 1, got {}", where, rope.factor));
  if (type == "llama3") {
    require({"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
    rope.low_freq_factor = r.number("low_freq_factor", 1.0);
    rope.high_freq_factor = r.number("high_freq_factor", 4.0);
    rope.original_max_position_embeddings = r.positive("original_max_position_embeddings", 8192);
    if (rope.high_freq_factor == rope.low_freq_factor) {
      throw ConfigError(fmt::format("{}: high_freq_factor must differ from low_freq_factor", where));
    }
  } else if (type == "yarn") {
    if (r.has("original_max_position_embeddings")) {
      rope.original_max_position_embeddings = r.positive("original_max_position_embeddings", 1);
    }
    if (r.has("attention_factor")) rope.attention_factor = r.number("attention_factor", 1.0);
    rope.beta_fast = r.number("beta_fast", 32.0);
    rope.beta_slow = r.number("beta_slow", 1.0);
    if (rope.beta_fast == rope.beta_slow) {  // the ramp between them would divide by zero
      throw ConfigError(fmt::format("{}: beta_fast must differ from beta_slow, both are {}", where, rope.beta_fast));
    }
    // As in Python, a zero mscale counts as not given.
    if (r.number("mscale", 0.0) != 0.0) rope.mscale = r.number("mscale", 0.0);
    if (r.number("mscale_all_dim", 0.0) != 0.0) rope.mscale_all_dim = r.number("mscale_all_dim", 0.0);
    rope.truncate = r.boolean("truncate", true);
  }
  return rope;
}

// A window size, or none: an absent field takes the family's default, an explicit null turns it off.
std::optional<int64_t> read_window(const json& j, const FieldReader& f, std::optional<int64_t> fallback) {
  if (!j.contains("sliding_window")) return fallback;
  if (j.at("sliding_window").is_null()) return std::nullopt;
  return f.positive("sliding_window", 1);
}

// `layer_types` when the config lists it (false when it does not): one full or sliding entry a layer.
bool read_layer_type_list(const json& j, const FieldReader& f, DecoderConfig& d, const std::string& source) {
  if (!f.has("layer_types")) return false;
  const auto& types = j.at("layer_types");
  if (!types.is_array() || static_cast<int64_t>(types.size()) != d.num_hidden_layers) {
    throw ConfigError(fmt::format("{}: field 'layer_types' must list {} entries (num_hidden_layers), got {}", source,
                                  d.num_hidden_layers, printable(types.dump(), 200)));
  }
  for (size_t i = 0; i < types.size(); ++i) {
    const auto& t = types[i];
    if (t != kFullAttention && t != kSlidingAttention) {
      throw ConfigError(fmt::format("{}: layer_types[{}] is {}; expected \"{}\" or \"{}\"", source, i,
                                    printable(t.dump(), 100), kFullAttention, kSlidingAttention));
    }
    if (t == kSlidingAttention && !d.sliding_window) {
      throw ConfigError(fmt::format("{}: layer_types[{}] is sliding_attention but the config has no sliding window "
                                    "(set use_sliding_window and sliding_window)",
                                    source, i));
    }
    d.layer_types[i] = t.get<std::string>();
  }
  return true;
}

// Which layers slide, per family (hf-semantics 5.2, 5.3).
void read_layer_types(const json& j, const FieldReader& f, const DecoderTraits& family, DecoderConfig& d,
                      const std::string& source) {
  using Sliding = DecoderTraits::SlidingLayers;
  d.layer_types.assign(d.num_hidden_layers, kFullAttention);
  if (family.sliding == Sliding::kNone) {
    d.sliding_window.reset();
    return;
  }
  if (family.sliding == Sliding::kEvenLayers) {
    d.sliding_window = read_window(j, f, family.defaults.sliding_window);
    for (int64_t i = 0; d.sliding_window && i < d.num_hidden_layers; i += 2) d.layer_types[i] = kSlidingAttention;
    return;
  }
  if (family.sliding == Sliding::kAll || family.sliding == Sliding::kAllWhenUsed) {
    const bool used = family.sliding == Sliding::kAll || f.boolean("use_sliding_window", false);
    d.sliding_window = used ? read_window(j, f, family.defaults.sliding_window) : std::nullopt;
    if (d.sliding_window) d.layer_types.assign(d.num_hidden_layers, kSlidingAttention);
    return;
  }
  if (family.sliding == Sliding::kPattern) {
    d.sliding_window = read_window(j, f, family.defaults.sliding_window);
    if (read_layer_type_list(j, f, d, source)) return;
    const int64_t pattern = f.positive("sliding_window_pattern", family.sliding_window_pattern);
    for (int64_t i = 0; d.sliding_window && i < d.num_hidden_layers; ++i) {
      if ((i + 1) % pattern != 0) d.layer_types[i] = kSlidingAttention;
    }
    return;
  }
  // Qwen2: the window size is read (and checked) only when the window is on.
  d.sliding_window.reset();
  if (f.boolean("use_sliding_window", false)) d.sliding_window = read_window(j, f, family.defaults.sliding_window);
  if (read_layer_type_list(j, f, d, source)) return;
  const int64_t first_sliding = f.integer("max_window_layers", 28);
  for (int64_t i = 0; i < d.num_hidden_layers; ++i) {
    if (d.sliding_window && i >= first_sliding) d.layer_types[i] = kSlidingAttention;
  }
}

// The number of experts under either spelling: the hub's `num_experts` (Qwen, OLMoE) or
// `num_local_experts` (Mixtral; what transformers 5.x writes for a re-saved Qwen3-MoE, its attribute map).
int64_t read_num_experts(const FieldReader& f, int64_t fallback, const std::string& source) {
  std::optional<std::pair<const char*, int64_t>> found;
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts"}) {
    if (!f.has(key)) continue;
    const int64_t n = f.positive(key, fallback);
    if (found && found->second != n) {
      throw ConfigError(fmt::format("{}: {} {} and {} {} disagree (they are spellings of one field); keep one", source,
                                    found->first, found->second, key, n));
    }
    found = std::pair{key, n};
  }
  return found ? found->second : fallback;
}

// The DeepSeek-style router's groups: every group as large, at least two experts each (a group is
// ranked by its two best scores), no more groups searched than there are.
void read_groups(const FieldReader& f, const MoeConfig& defaults, MoeConfig& moe, const std::string& source) {
  moe.n_group = f.positive("n_group", defaults.n_group);
  moe.topk_group = f.positive("topk_group", defaults.topk_group);
  moe.routed_scaling_factor = f.number("routed_scaling_factor", defaults.routed_scaling_factor);
  moe.first_k_dense_replace = f.integer("first_k_dense_replace", defaults.first_k_dense_replace);
  if (moe.first_k_dense_replace < 0) {
    throw ConfigError(fmt::format("{}: first_k_dense_replace must not be negative, got {}", source, moe.first_k_dense_replace));
  }
  if (!(moe.routed_scaling_factor > 0) || !std::isfinite(moe.routed_scaling_factor)) {
    throw ConfigError(fmt::format("{}: routed_scaling_factor must be a positive number", source));
  }
  if (!f.has("n_group") && !f.has("topk_group")) return;  // the softmax routers have no groups
  if (moe.num_experts % moe.n_group != 0 || moe.num_experts / moe.n_group < 2) {
    throw ConfigError(fmt::format("{}: n_group {} must split the {} experts into equal groups of at least two", source,
                                  moe.n_group, moe.num_experts));
  }
  if (moe.topk_group > moe.n_group) {
    throw ConfigError(fmt::format("{}: topk_group {} is more than n_group {}", source, moe.topk_group, moe.n_group));
  }
  if (moe.num_experts_per_tok > moe.topk_group * (moe.num_experts / moe.n_group)) {
    throw ConfigError(fmt::format("{}: num_experts_per_tok {} is more than the {} experts of the topk_group {} groups "
                                  "searched",
                                  source, moe.num_experts_per_tok, moe.topk_group * (moe.num_experts / moe.n_group),
                                  moe.topk_group));
  }
}

// `rope`, and `sliding_rope` when v5's rope_parameters holds one entry per layer type (Gemma 3).
void read_ropes(const json& j, const std::string& source, DecoderConfig& d) {
  const auto params = j.find("rope_parameters");
  const bool per_type = params != j.end() && params->is_object() && params->contains(kFullAttention);
  if (!per_type) {
    d.rope = read_rope(j, source);
    return;
  }
  for (const auto& [key, value] : params->items()) {
    if (key != kFullAttention && key != kSlidingAttention) {
      throw ConfigError(fmt::format("{}: rope_parameters has an entry '{}'; per layer type it holds \"{}\" and \"{}\"",
                                    source, printable(key, 100), kFullAttention, kSlidingAttention));
    }
  }
  const auto of_type = [&](const char* type) {
    json alone = j;
    alone.erase("rope_scaling");
    alone["rope_parameters"] = params->at(type);
    return read_rope(alone, fmt::format("{} (rope_parameters.{})", source, type));
  };
  d.rope = of_type(kFullAttention);
  if (params->contains(kSlidingAttention)) d.sliding_rope = of_type(kSlidingAttention);
}

MoeConfig read_moe(const json& j, const FieldReader& f, const MoeConfig& defaults, const DecoderConfig& d,
                   const std::string& source, const std::string& width_field) {
  MoeConfig moe;
  moe.num_experts = read_num_experts(f, defaults.num_experts, source);
  moe.num_experts_per_tok = f.positive("num_experts_per_tok", defaults.num_experts_per_tok);
  if (moe.num_experts_per_tok > moe.num_experts) {
    throw ConfigError(fmt::format("{}: num_experts_per_tok {} is more than num_experts {}", source,
                                  moe.num_experts_per_tok, moe.num_experts));
  }
  moe.moe_intermediate_size = f.positive(width_field.c_str(), width_field == "intermediate_size"
                                                                   ? d.intermediate_size
                                                                   : defaults.moe_intermediate_size);
  moe.shared_expert_intermediate_size =
      defaults.shared_expert_intermediate_size > 0
          ? f.positive("shared_expert_intermediate_size", defaults.shared_expert_intermediate_size)
          : 0;
  moe.norm_topk_prob = f.boolean("norm_topk_prob", defaults.norm_topk_prob);
  moe.decoder_sparse_step = f.positive("decoder_sparse_step", defaults.decoder_sparse_step);
  moe.router_aux_loss_coef = f.number("router_aux_loss_coef", defaults.router_aux_loss_coef);
  if (f.has("mlp_only_layers")) {
    const auto& layers = j.at("mlp_only_layers");
    if (!layers.is_array()) throw ConfigError(fmt::format("{}: field 'mlp_only_layers' must be a list", source));
    for (const auto& layer : layers) {
      if (!layer.is_number_integer() || layer.get<int64_t>() < 0 || layer.get<int64_t>() >= d.num_hidden_layers) {
        throw ConfigError(fmt::format("{}: mlp_only_layers holds {}, not a layer index below {}", source, layer.dump(),
                                      d.num_hidden_layers));
      }
      moe.mlp_only_layers.push_back(layer.get<int64_t>());
    }
  }
  read_groups(f, defaults, moe, source);
  moe.experts_implementation = f.string("experts_implementation", defaults.experts_implementation);
  if (moe.experts_implementation != "grouped" && moe.experts_implementation != "eager") {
    throw ConfigError(fmt::format("{}: experts_implementation '{}' is not one of grouped, eager", source,
                                  printable(moe.experts_implementation, 200)));
  }
  moe.implementation =
      moe.experts_implementation == "eager" ? nn::ExpertsImplementation::kEager : nn::ExpertsImplementation::kGrouped;
  return moe;
}

std::vector<int64_t> read_token_ids(const json& j, const char* key, const std::string& source) {
  if (!j.contains(key) || j.at(key).is_null()) return {};
  const auto& v = j.at(key);
  std::vector<int64_t> ids;
  for (const auto& id : v.is_array() ? v : json::array({v})) {
    if (!id.is_number_integer()) {
      throw ConfigError(fmt::format("{}: field '{}' must be a token id or a list of them, got {}", source, key, v.dump()));
    }
    ids.push_back(id.get<int64_t>());
  }
  return ids;
}

}  // namespace

FamilyFields::~FamilyFields() = default;

void BertConfig::to_json(json& j) const {
  j["type_vocab_size"] = type_vocab_size;
  j["layer_norm_eps"] = layer_norm_eps;
  j["is_decoder"] = is_decoder;
  j["add_cross_attention"] = add_cross_attention;
}

ModelConfig parse_decoder_config(const json& j, const std::string& source, const DecoderTraits& family) {
  if (!j.is_object()) throw ConfigError(fmt::format("{}: expected a JSON object", source));
  FieldReader f(j, source);
  ModelConfig config;
  config.raw = j;
  config.model_type = f.string("model_type", "");
  const DecoderConfig& defaults = family.defaults;

  DecoderConfig& d = config.decoder;
  d.vocab_size = f.positive("vocab_size", defaults.vocab_size);
  d.hidden_size = f.positive("hidden_size", defaults.hidden_size);
  d.intermediate_size = f.positive("intermediate_size", defaults.intermediate_size);
  d.num_hidden_layers = f.positive("num_hidden_layers", defaults.num_hidden_layers);
  // Per-layer lists (layer_types) are built before the size check; no model has a million layers.
  constexpr int64_t kMaxLayers = 1000000;
  if (d.num_hidden_layers > kMaxLayers) {
    throw ConfigError(fmt::format("{}: num_hidden_layers {} is more than the {} layers torchpatch builds", source,
                                  d.num_hidden_layers, kMaxLayers));
  }
  d.num_attention_heads = f.positive("num_attention_heads", defaults.num_attention_heads);
  d.num_key_value_heads = f.positive("num_key_value_heads", defaults.num_key_value_heads > 0 ? defaults.num_key_value_heads : d.num_attention_heads);
  if (family.fixed_head_dim) {
    d.head_dim = f.positive("head_dim", defaults.head_dim);
  } else {
    if (!f.has("head_dim") && d.hidden_size % d.num_attention_heads != 0) {
      throw ConfigError(fmt::format("{}: hidden_size {} is not divisible by num_attention_heads {} (set head_dim)",
                                    source, d.hidden_size, d.num_attention_heads));
    }
    d.head_dim = f.positive("head_dim", d.hidden_size / d.num_attention_heads);
  }
  if (d.num_attention_heads % d.num_key_value_heads != 0) {
    throw ConfigError(fmt::format("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", source,
                                  d.num_attention_heads, d.num_key_value_heads));
  }
  d.max_position_embeddings = f.positive("max_position_embeddings", defaults.max_position_embeddings);
  d.rms_norm_eps = f.number("rms_norm_eps", defaults.rms_norm_eps);
  if (d.rms_norm_eps < 0) throw ConfigError(fmt::format("{}: rms_norm_eps must be >= 0, got {}", source, d.rms_norm_eps));
  d.hidden_act = f.string("hidden_act", defaults.hidden_act);
  if (family.activation_field != "hidden_act") d.hidden_act = f.string(family.activation_field.c_str(), defaults.hidden_act);
  d.activation = nn::parse_activation(d.hidden_act, family.activation_field);
  switch (family.biases) {
    case DecoderTraits::Biases::kFromConfig:
      d.attention_bias = f.boolean("attention_bias", defaults.attention_bias);
      d.qkv_bias = d.o_bias = d.attention_bias;
      d.mlp_bias = f.boolean("mlp_bias", defaults.mlp_bias);
      break;
    case DecoderTraits::Biases::kNone: d.attention_bias = d.qkv_bias = d.o_bias = d.mlp_bias = false; break;
    case DecoderTraits::Biases::kQkvFromConfig:
      d.attention_bias = f.boolean("attention_bias", defaults.attention_bias);
      d.qkv_bias = d.attention_bias;
      d.o_bias = false;
      d.mlp_bias = false;
      break;
    case DecoderTraits::Biases::kQkvOnly:
      d.qkv_bias = true;
      d.attention_bias = d.o_bias = d.mlp_bias = false;
      break;
  }
  d.tie_word_embeddings = f.boolean("tie_word_embeddings", defaults.tie_word_embeddings);
  if (f.has("pad_token_id")) d.pad_token_id = f.integer("pad_token_id", 0);
  d.eos_token_ids = read_token_ids(j, "eos_token_id", source);
  read_layer_types(j, f, family, d, source);
  d.qk_norm = defaults.qk_norm;
  if (family.moe) d.moe = read_moe(j, f, defaults.moe, d, source, family.expert_width_field);
  read_ropes(j, source, d);
  for (const auto* rope : {&d.rope, d.sliding_rope ? &*d.sliding_rope : nullptr}) {
    if (rope && (rope->partial_rotary_factor <= 0 || rope->partial_rotary_factor > 1)) {
      throw ConfigError(fmt::format("{}: partial_rotary_factor must be in (0, 1], got {}", source,
                                    rope->partial_rotary_factor));
    }
  }
  return config;
}

ModelConfig ModelConfig::from_json(const json& j, const std::string& source, const FamilyRegistry* families) {
  if (!j.is_object()) throw ConfigError(fmt::format("{}: expected a JSON object", source));
  FieldReader f(j, source);
  if (!f.has("model_type")) throw ConfigError(fmt::format("{}: missing required field 'model_type'", source));
  const auto family = family_of(f.string("model_type", ""), source, families ? *families : global_families());
  auto config = family->parse_config(j, source);
  config.family = family;
  return config;
}

bool MoeConfig::is_sparse_layer(int64_t layer_idx) const {
  const bool listed = std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer_idx) != mlp_only_layers.end();
  return num_experts > 0 && !listed && layer_idx >= first_k_dense_replace && (layer_idx + 1) % decoder_sparse_step == 0;
}

int64_t DecoderConfig::max_positions() const {
  const auto scaled = [](int64_t length, double factor) {
    const double positions = static_cast<double>(length) * factor;
    // Saturates: a factor too large for int64 positions means no limit a sequence can reach.
    constexpr double kInt64Bound = 9.2e18;
    return positions >= kInt64Bound ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(positions);
  };
  const auto type = rope.kind;
  if (type == nn::RopeKind::kDynamic) return std::numeric_limits<int64_t>::max();  // NTK scaling follows any length
  if (type == nn::RopeKind::kLinear) return scaled(max_position_embeddings, rope.factor);
  if ((type == nn::RopeKind::kYarn || type == nn::RopeKind::kLlama3) && rope.original_max_position_embeddings > 0) {
    return std::max(max_position_embeddings, scaled(rope.original_max_position_embeddings, rope.factor));
  }
  return max_position_embeddings;
}

namespace {

// The matrices a decoder config implies, in double precision so that absurd sizes do not overflow:
// the embedding table, and per layer the attention (q, o; k, v), a dense MLP and all experts. Two
// matrices is the least any MLP has (BERT's; gated ones have three).
struct SizeTerms {
  double embeddings, attention, dense, experts;
};

SizeTerms size_terms(const DecoderConfig& d) {
  const double h = static_cast<double>(d.hidden_size);
  return {static_cast<double>(d.vocab_size) * h,
          h * static_cast<double>(d.head_dim) * (2 * static_cast<double>(d.num_attention_heads) + 2 * static_cast<double>(d.num_key_value_heads)),
          2 * h * static_cast<double>(d.intermediate_size),
          2 * h * static_cast<double>(d.moe.num_experts) * static_cast<double>(d.moe.moe_intermediate_size)};
}

}  // namespace

std::string DecoderConfig::largest_size_term() const {
  const auto t = size_terms(*this);
  const double layers = static_cast<double>(num_hidden_layers);
  if (t.embeddings >= layers * std::max({t.attention, t.dense, t.experts})) {
    return fmt::format("the embeddings, vocab_size {} x hidden_size {}", vocab_size, hidden_size);
  }
  if (t.attention >= std::max(t.dense, t.experts)) {
    return fmt::format("attention: num_hidden_layers {} x hidden_size {} x head_dim {} x (2 x {} num_attention_heads "
                       "+ 2 x {} num_key_value_heads)",
                       num_hidden_layers, hidden_size, head_dim, num_attention_heads, num_key_value_heads);
  }
  if (t.experts > t.dense) {
    return fmt::format("experts: num_hidden_layers {} x hidden_size {} x {} experts x moe_intermediate_size {}",
                       num_hidden_layers, hidden_size, moe.num_experts, moe.moe_intermediate_size);
  }
  return fmt::format("MLPs: num_hidden_layers {} x hidden_size {} x intermediate_size {}", num_hidden_layers, hidden_size,
                     intermediate_size);
}

double DecoderConfig::parameter_lower_bound() const {
  const auto t = size_terms(*this);
  double total = t.embeddings;
  constexpr int64_t kExact = 4096;  // layers looked at one by one; the rest count at the smaller MLP
  for (int64_t layer = 0; layer < std::min(num_hidden_layers, kExact); ++layer) {
    total += t.attention + (moe.is_sparse_layer(layer) ? t.experts : t.dense);
  }
  const double rest = static_cast<double>(std::max<int64_t>(0, num_hidden_layers - kExact));
  return total + rest * (t.attention + (moe.num_experts > 0 ? std::min(t.dense, t.experts) : t.dense));
}

std::string DecoderConfig::position_limit(bool rotary) const {
  if (!rotary) return fmt::format("max_position_embeddings {}", max_position_embeddings);
  const bool stretched = rope.kind == nn::RopeKind::kLinear || rope.kind == nn::RopeKind::kDynamic;
  return fmt::format("{}: max_position_embeddings {}{}", max_positions(), max_position_embeddings,
                     stretched ? fmt::format(" x rope factor {}", rope.factor)
                               : ", and rope_type '" + rope.rope_type + "' does not stretch it");
}

ModelConfig ModelConfig::from_file(const std::filesystem::path& path, const FamilyRegistry* families,
                                   const std::string& source) {
  if (path.empty()) throw ConfigError("model path is empty (give a checkpoint directory)");
  if (source.empty() && !path_exists(path)) throw ConfigError(fmt::format("{}: no such file or directory", path.string()));
  // A directory given directly is a checkpoint directory; a named file is read as it is (a directory
  // there is refused as one).
  const auto file = source.empty() && std::filesystem::is_directory(path) ? path / "config.json" : path;
  const std::string name = source.empty() ? file.string() : source;
  for (const char* weights : {".safetensors", ".bin", ".gguf", ".pt", ".pth"}) {
    if (file.extension() != weights) continue;
    throw ConfigError(fmt::format("{}: a weights file, not a checkpoint: give the directory that holds it and its "
                                  "config.json ({})",
                                  name, file.parent_path().empty() ? "." : file.parent_path().string()));
  }
  if (!path_exists(file)) {
    throw ConfigError(fmt::format("{}: no config file (a checkpoint directory holds config.json and "
                                  "model.safetensors)",
                                  name));
  }
  const auto j = read_json_file(file, [](const std::string& message) { throw ConfigError(message); }, {}, name);
  return from_json(j, name, families);
}

json ModelConfig::to_json() const {
  json j = raw;
  j["model_type"] = model_type;
  j["vocab_size"] = decoder.vocab_size;
  j["hidden_size"] = decoder.hidden_size;
  j["intermediate_size"] = decoder.intermediate_size;
  j["num_hidden_layers"] = decoder.num_hidden_layers;
  j["num_attention_heads"] = decoder.num_attention_heads;
  j["max_position_embeddings"] = decoder.max_position_embeddings;
  j["hidden_act"] = decoder.hidden_act;
  j["tie_word_embeddings"] = decoder.tie_word_embeddings;
  if (fields) {
    fields->to_json(j);
    if (!fields->has_decoder_fields()) return j;
  }
  j["num_key_value_heads"] = decoder.num_key_value_heads;
  j["head_dim"] = decoder.head_dim;
  j["rms_norm_eps"] = decoder.rms_norm_eps;
  j["attention_bias"] = decoder.attention_bias;
  j["mlp_bias"] = decoder.mlp_bias;
  j["rope_theta"] = decoder.rope.theta;
  return j;
}

}  // namespace torchpatch
