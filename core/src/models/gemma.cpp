// Gemma, Gemma2 and Gemma 3 (text): Hugging Face's defaults, class names and patch points on the shared decoder
// blocks, with what the two do differently.
#include "torchpatch/models/gemma.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/models/decoder_family.h"

namespace torchpatch {

namespace {
DecoderTraits gemma_traits() {
  DecoderTraits traits;  // GemmaConfig defaults
  auto& d = traits.defaults;
  d.vocab_size = 256000;
  d.hidden_size = 3072;
  d.intermediate_size = 24576;
  d.num_hidden_layers = 28;
  d.num_attention_heads = 16;
  d.num_key_value_heads = 16;
  d.head_dim = 256;
  d.max_position_embeddings = 8192;
  d.rms_norm_eps = 1e-6;
  d.hidden_act = "gelu_pytorch_tanh";  // hidden_activation; None means this, whatever hidden_act says
  d.tie_word_embeddings = true;
  traits.fixed_head_dim = true;
  traits.activation_field = "hidden_activation";
  return traits;
}

nlohmann::json tiny_gemma_preset(const std::string& model_type, const std::string& causal_lm) {
  auto tiny = tiny_decoder_preset(model_type, causal_lm);
  tiny["head_dim"] = 16;
  return tiny;
}
}  // namespace

namespace gemma {

const DecoderSpec& spec() {
  static const DecoderSpec spec{"GemmaAttention",    "GemmaMLP",   "GemmaRMSNorm",
                                "GemmaDecoderLayer", "GemmaModel", "GemmaForCausalLM"};
  return spec;
}

at::Tensor GemmaModel::embed(const at::Tensor& ids) {
  auto h = embed_tokens->forward(ids);
  const double scale = std::sqrt(static_cast<double>(config().decoder.hidden_size));
  return h * at::scalar_tensor(scale, h.options());  // rounded to h's dtype first, as Hugging Face does
}

Family family() {
  auto family = decoder_family<GemmaAttention, GemmaMLP, GemmaRMSNorm, GemmaDecoderLayer, GemmaModel, GemmaForCausalLM>(
      "gemma", spec(), gemma_traits());
  family.presets = {{"tiny-gemma", tiny_gemma_preset("gemma", "GemmaForCausalLM")}};
  return family;
}

}  // namespace gemma

// llama.cpp's gemma2 and gemma3 have no key for the attention scale: they divide scores by
// sqrt(head_dim), except in the 27B model (`layers_of_27b` layers), by sqrt(hidden_size / heads).
namespace {
double llama_cpp_query_scalar(int64_t layers, int64_t hidden, int64_t heads, int64_t head_dim, int64_t layers_of_27b) {
  return static_cast<double>(layers == layers_of_27b ? hidden / heads : head_dim);
}

using GemmaGgufMetadata = std::vector<std::pair<std::string, checkpoint::GgufValue>> (*)(const nlohmann::json&,
                                                                                        const DecoderTraits&);

// Gemma 2 and 3 in llama.cpp's files: norms after attention and the MLP, every norm stored as 1 + w.
GgufArchitecture gemma_gguf_architecture(const char* name, nlohmann::json (*config)(const GgufMetadata&),
                                         GemmaGgufMetadata metadata, const DecoderTraits& traits) {
  GgufArchitecture a;
  a.names = {name};
  a.config = config;
  a.tensors = gguf_post_norm_tensor_names(/*permuted_qk=*/false);
  gguf_unit_offset_norms(a.tensors);
  a.metadata = [metadata, traits](const nlohmann::json& c) { return metadata(c, traits); };
  return a;
}
}  // namespace

namespace gemma2 {

const DecoderSpec& spec() {
  static const DecoderSpec spec{"Gemma2Attention",    "Gemma2MLP",   "Gemma2RMSNorm",
                                "Gemma2DecoderLayer", "Gemma2Model", "Gemma2ForCausalLM"};
  return spec;
}

void Gemma2Config::to_json(nlohmann::json& j) const {
  j["query_pre_attn_scalar"] = query_pre_attn_scalar;
  j["attn_logit_softcapping"] = attn_logit_softcapping ? nlohmann::json(*attn_logit_softcapping) : nlohmann::json();
  j["final_logit_softcapping"] = final_logit_softcapping ? nlohmann::json(*final_logit_softcapping) : nlohmann::json();
}

nn::GqaOptions gemma2_attention_options(const ModelConfig& config) {
  const auto& own = config.family_fields<Gemma2Config>();
  auto options = attention_options(config.decoder);
  options.scaling = 1.0 / std::sqrt(own.query_pre_attn_scalar);
  options.softcap = own.attn_logit_softcapping;
  return options;
}

namespace {

// A soft cap: absent or null keeps the default, an explicit null turns it off.
std::optional<double> read_cap(const ConfigReader& f, const char* key, std::optional<double> fallback) {
  if (!f.json().contains(key)) return fallback;
  if (f.json().at(key).is_null()) return std::nullopt;
  const double cap = f.number(key, 0);
  if (cap <= 0) f.fail(fmt::format("field '{}' must be positive or null, got {}", key, cap));
  return cap;
}
}  // namespace

// Gemma2's fields; `defaults` gives the scalar and the caps when absent.
std::shared_ptr<Gemma2Config> read_gemma2_fields(const ConfigReader& f, const Gemma2Config& defaults) {
  auto own = std::make_shared<Gemma2Config>(defaults);
  own->query_pre_attn_scalar = f.number("query_pre_attn_scalar", defaults.query_pre_attn_scalar);
  if (own->query_pre_attn_scalar <= 0) f.fail("field 'query_pre_attn_scalar' must be positive");
  own->attn_logit_softcapping = read_cap(f, "attn_logit_softcapping", defaults.attn_logit_softcapping);
  own->final_logit_softcapping = read_cap(f, "final_logit_softcapping", defaults.final_logit_softcapping);
  return own;
}

Gemma2Attention::Gemma2Attention(const BuildContext& ctx) : GqaAttention(gemma2_attention_options(model_config(ctx))) {}

Gemma2DecoderLayer::Gemma2DecoderLayer(const BuildContext& ctx) : Gemma2DecoderLayer(ctx, spec()) {}

Gemma2DecoderLayer::Gemma2DecoderLayer(const BuildContext& ctx, const DecoderSpec& s) {
  self_attn = register_module("self_attn", build<roles::Attention>(s.attention, ctx.child("self_attn")));
  mlp = register_module("mlp", build<roles::Mlp>(s.mlp, ctx.child("mlp")));
  for (auto [slot, name] : {std::pair{&input_layernorm, "input_layernorm"},
                            std::pair{&post_attention_layernorm, "post_attention_layernorm"},
                            std::pair{&pre_feedforward_layernorm, "pre_feedforward_layernorm"},
                            std::pair{&post_feedforward_layernorm, "post_feedforward_layernorm"}}) {
    *slot = register_module(name, build<roles::Norm>(s.norm, ctx.child(name)));
  }
}

at::Tensor Gemma2DecoderLayer::forward_impl(const at::Tensor& hidden, const AttentionInputs& inputs) {
  auto h = hidden + post_attention_layernorm->forward(self_attn->forward(input_layernorm->forward(hidden), inputs));
  return h + post_feedforward_layernorm->forward(mlp->forward(pre_feedforward_layernorm->forward(h)));
}

at::Tensor Gemma2ForCausalLM::logits(const at::Tensor& hidden) {
  auto out = lm_head->forward(hidden);
  const auto& cap = config().family_fields<Gemma2Config>().final_logit_softcapping;
  return cap ? at::tanh(out / *cap) * *cap : out;
}

namespace {

constexpr int64_t kLayersOf27B = 46;

// config.json of a file llama.cpp's converter wrote as "gemma2", as llama.cpp reads it: its defaults
// for what the file leaves out (both soft caps, always applied; a window of 4096 on the even layers).
nlohmann::json gguf_config(const GgufMetadata& m) {
  auto c = gguf_decoder_config(m, "gemma2", "Gemma2ForCausalLM");
  c.erase("hidden_act");
  c["hidden_activation"] = "gelu_pytorch_tanh";
  const auto layers = c["num_hidden_layers"].get<int64_t>(), hidden = c["hidden_size"].get<int64_t>();
  const auto heads = c["num_attention_heads"].get<int64_t>();
  if (heads <= 0) m.fail(m.full("attention.head_count"), fmt::format("{}, not a positive head count", heads));
  const auto head_dim = m.integer_or("attention.key_length").value_or(hidden / heads);
  c["head_dim"] = head_dim;
  c["query_pre_attn_scalar"] = llama_cpp_query_scalar(layers, hidden, heads, head_dim, kLayersOf27B);
  c["attn_logit_softcapping"] = m.number_or("attn_logit_softcapping").value_or(50.0);
  c["final_logit_softcapping"] = m.number_or("final_logit_softcapping").value_or(30.0);
  c["sliding_window"] = m.integer_or("attention.sliding_window").value_or(4096);
  std::vector<std::string> even(static_cast<size_t>(std::max<int64_t>(layers, 0)), "full_attention");
  for (size_t i = 0; i < even.size(); i += 2) even[i] = "sliding_attention";
  if (gguf_layer_types(m, layers, 2) != nlohmann::json(even)) {
    m.fail(m.full("attention.sliding_window_pattern"), "not Gemma 2's even layers sliding, which torchpatch's gemma2 runs");
  }
  if (const auto swa_base = m.number_or("rope.freq_base_swa"); swa_base && *swa_base != c["rope_theta"].get<double>()) {
    m.fail(m.full("rope.freq_base_swa"), fmt::format("{}: the sliding layers' RoPE base differs from the others' ({}), "
                                                     "which Gemma 2 does not have",
                                                     *swa_base, c["rope_theta"].get<double>()));
  }
  return c;
}

// What llama.cpp's converter writes for a Gemma 2 config, and what llama.cpp's gemma2 cannot run refused.
std::vector<std::pair<std::string, checkpoint::GgufValue>> gguf_metadata(const nlohmann::json& c,
                                                                        const DecoderTraits& traits) {
  const std::string source = "gemma2 as GGUF architecture 'gemma2'";
  auto config = parse_decoder_config(c, source, traits);
  const auto own = read_gemma2_fields(ConfigReader(c, source), Gemma2Config{});
  const auto& d = config.decoder;
  auto m = gguf_decoder_metadata("gemma2", c, "gelu_pytorch_tanh");
  const auto scalar =
      llama_cpp_query_scalar(d.num_hidden_layers, d.hidden_size, d.num_attention_heads, d.head_dim, kLayersOf27B);
  if (own->query_pre_attn_scalar != scalar) {
    throw ConfigError(fmt::format("{}: query_pre_attn_scalar {}: llama.cpp's gemma2 scales attention scores by {} "
                                  "** -0.5 and has no key for another scalar",
                                  source, own->query_pre_attn_scalar, scalar));
  }
  if (!own->attn_logit_softcapping || !own->final_logit_softcapping) {
    throw ConfigError(fmt::format("{}: a soft cap of null: llama.cpp's gemma2 always caps attention scores and logits "
                                  "(50 and 30 where the file has no value)",
                                  source));
  }
  m.emplace_back("gemma2.attn_logit_softcapping", checkpoint::GgufValue::of(static_cast<float>(*own->attn_logit_softcapping)));
  m.emplace_back("gemma2.final_logit_softcapping", checkpoint::GgufValue::of(static_cast<float>(*own->final_logit_softcapping)));
  m.emplace_back("gemma2.attention.sliding_window",
                 checkpoint::GgufValue::of(static_cast<uint32_t>(d.sliding_window.value_or(4096))));
  return m;
}

}  // namespace

Family family() {
  auto traits = gemma_traits();  // Gemma2Config defaults: Gemma's, and these
  traits.defaults.hidden_size = 2304;
  traits.defaults.intermediate_size = 9216;
  traits.defaults.num_hidden_layers = 26;
  traits.defaults.num_attention_heads = 8;
  traits.defaults.num_key_value_heads = 4;
  traits.defaults.sliding_window = 4096;
  traits.sliding = DecoderTraits::SlidingLayers::kEvenLayers;
  auto family = decoder_family<Gemma2Attention, Gemma2MLP, Gemma2RMSNorm, Gemma2DecoderLayer, Gemma2Model,
                               Gemma2ForCausalLM>("gemma2", spec(), traits);
  family.parse_config = [traits](const nlohmann::json& j, const std::string& source) {
    auto config = parse_decoder_config(j, source, traits);
    config.fields = read_gemma2_fields(ConfigReader(j, source), Gemma2Config{});
    return config;
  };
  family.attention_options = gemma2_attention_options;
  auto tiny = tiny_gemma_preset("gemma2", "Gemma2ForCausalLM");
  tiny.update({{"sliding_window", 8}, {"query_pre_attn_scalar", 16}});
  family.presets = {{"tiny-gemma2", tiny}};
  family.gguf = gemma_gguf_architecture("gemma2", gguf_config, gguf_metadata, traits);
  return family;
}

}  // namespace gemma2

namespace gemma3 {

const DecoderSpec& spec() {
  static const DecoderSpec spec{"Gemma3Attention",    "Gemma3MLP",       "Gemma3RMSNorm",
                                "Gemma3DecoderLayer", "Gemma3TextModel", "Gemma3ForCausalLM"};
  return spec;
}

namespace {
nn::QkNormOptions gemma3_qk_norm(const ModelConfig& config) {
  nn::QkNormOptions norm;
  norm.eps = config.decoder.rms_norm_eps;
  norm.unit_offset = true;  // Gemma's x * (1 + weight)
  return norm;
}
}  // namespace

Gemma3Attention::Gemma3Attention(const BuildContext& ctx)
    : QkNormAttention(gemma2::gemma2_attention_options(model_config(ctx)), gemma3_qk_norm(model_config(ctx))) {}

namespace {

// Gemma3TextConfig's own reading on top of the decoder's: the Gemma2 fields with Gemma 3's defaults
// and the sliding layers' RoPE.
ModelConfig parse_config(const nlohmann::json& j, const std::string& source, const DecoderTraits& traits) {
  auto config = parse_decoder_config(j, source, traits);
  ConfigReader f(j, source);
  if (f.boolean("use_bidirectional_attention", false)) {
    f.fail("use_bidirectional_attention true (EmbeddingGemma's encoder) is not supported; torchpatch builds Gemma 3 "
           "as a causal decoder");
  }
  gemma2::Gemma2Config defaults;
  defaults.query_pre_attn_scalar = 256;
  defaults.attn_logit_softcapping = std::nullopt;
  defaults.final_logit_softcapping = std::nullopt;
  config.fields = gemma2::read_gemma2_fields(f, defaults);
  // A v4 config gives the sliding layers' base alone; v5's per-type rope_parameters gave it already.
  if (!config.decoder.sliding_rope) {
    nn::RopeParameters local;
    local.theta = f.number("rope_local_base_freq", 10000.0);
    if (!(local.theta > 0)) f.fail("field 'rope_local_base_freq' must be positive");
    config.decoder.sliding_rope = local;
  }
  return config;
}

// llama.cpp assumes every 6th layer is full when a file gives no attention.sliding_window_pattern.
constexpr int64_t kLlamaCppPattern = 6;
// The 27B model, whose attention scale llama.cpp takes from hidden_size / num_attention_heads.
constexpr int64_t kLayersOf27B = 62;

// config.json of a file llama.cpp's converter wrote as "gemma3", as llama.cpp reads it.
nlohmann::json gguf_config(const GgufMetadata& m) {
  auto c = gguf_decoder_config(m, "gemma3_text", "Gemma3ForCausalLM");
  c.erase("hidden_act");
  c["hidden_activation"] = "gelu_pytorch_tanh";  // llama.cpp's gemma3 runs GELU, tanh approximation
  const auto layers = c["num_hidden_layers"].get<int64_t>(), hidden = c["hidden_size"].get<int64_t>();
  const auto heads = c["num_attention_heads"].get<int64_t>();
  if (heads <= 0) m.fail(m.full("attention.head_count"), fmt::format("{}, not a positive head count", heads));
  // Gemma's default head_dim is 256, so it is given even where it is hidden_size / heads.
  const auto head_dim = m.integer_or("attention.key_length").value_or(hidden / heads);
  c["head_dim"] = head_dim;
  c["query_pre_attn_scalar"] = llama_cpp_query_scalar(layers, hidden, heads, head_dim, kLayersOf27B);
  c["attn_logit_softcapping"] = nullptr;
  const auto cap = m.number_or("final_logit_softcapping");
  c["final_logit_softcapping"] = cap && *cap > 0 ? nlohmann::json(*cap) : nlohmann::json();
  c["rope_local_base_freq"] = m.number_or("rope.freq_base_swa").value_or(10000.0);  // llama.cpp's default
  const auto window = m.integer_or("attention.sliding_window");
  if (window && *window > 0) {
    c["sliding_window"] = *window;
    c["layer_types"] = gguf_layer_types(m, layers, kLlamaCppPattern);
  } else {
    c["sliding_window"] = nullptr;
    c["layer_types"] = std::vector<std::string>(static_cast<size_t>(std::max<int64_t>(layers, 0)), "full_attention");
  }
  return c;
}

// What llama.cpp's converter writes for a Gemma 3 config, and the keys it has none for refused.
std::vector<std::pair<std::string, checkpoint::GgufValue>> gguf_metadata(const nlohmann::json& c,
                                                                        const DecoderTraits& traits) {
  const std::string source = "gemma3_text as GGUF architecture 'gemma3'";
  const auto config = parse_config(c, source, traits);
  const auto& d = config.decoder;
  const auto& own = config.family_fields<gemma2::Gemma2Config>();
  auto full = c;
  full["rope_theta"] = d.rope.theta;  // v5's per-type rope_parameters give it only there
  auto m = gguf_decoder_metadata("gemma3", full, "gelu_pytorch_tanh");
  const auto scalar =
      llama_cpp_query_scalar(d.num_hidden_layers, d.hidden_size, d.num_attention_heads, d.head_dim, kLayersOf27B);
  if (own.query_pre_attn_scalar != scalar) {
    throw ConfigError(fmt::format("{}: query_pre_attn_scalar {}: llama.cpp's gemma3 scales attention scores by {} "
                                  "** -0.5 and has no key for another scalar",
                                  source, own.query_pre_attn_scalar, scalar));
  }
  if (own.attn_logit_softcapping) {
    throw ConfigError(fmt::format("{}: attn_logit_softcapping {}: llama.cpp's gemma3 does not cap attention scores "
                                  "(set it to null)", source, *own.attn_logit_softcapping));
  }
  if (own.final_logit_softcapping) {
    const auto cap = static_cast<float>(*own.final_logit_softcapping);
    m.emplace_back("gemma3.final_logit_softcapping", checkpoint::GgufValue::of(cap));
  }
  if (d.sliding_rope->rope_type != "default") {
    throw ConfigError(fmt::format("{}: the sliding layers' rope_type '{}': llama.cpp's gemma3 scales only the full "
                                  "layers' RoPE (give the sliding layers rope_type 'default')",
                                  source, d.sliding_rope->rope_type));
  }
  m.emplace_back("gemma3.rope.freq_base_swa", checkpoint::GgufValue::of(static_cast<float>(d.sliding_rope->theta)));
  const bool slides = std::count(d.layer_types.begin(), d.layer_types.end(), "sliding_attention") > 0;
  if (slides && d.sliding_window) {
    const auto window = static_cast<uint32_t>(*d.sliding_window);
    m.emplace_back("gemma3.attention.sliding_window", checkpoint::GgufValue::of(window));
    if (auto pattern = gguf_sliding_pattern(d.layer_types, kLlamaCppPattern)) {
      m.emplace_back("gemma3.attention.sliding_window_pattern", std::move(*pattern));
    }
  }
  return m;
}

}  // namespace

Family family() {
  auto traits = gemma_traits();  // Gemma3TextConfig defaults: Gemma's, and these
  auto& d = traits.defaults;
  d.vocab_size = 262208;
  d.hidden_size = 2304;
  d.intermediate_size = 9216;
  d.num_hidden_layers = 26;
  d.num_attention_heads = 8;
  d.num_key_value_heads = 4;
  d.max_position_embeddings = 131072;
  d.sliding_window = 4096;
  traits.sliding = DecoderTraits::SlidingLayers::kPattern;
  auto family = decoder_family<Gemma3Attention, Gemma3MLP, Gemma3RMSNorm, Gemma3DecoderLayer, Gemma3TextModel,
                               Gemma3ForCausalLM>("gemma3_text", spec(), traits);
  family.parse_config = [traits](const nlohmann::json& j, const std::string& source) {
    return parse_config(j, source, traits);
  };
  family.attention_options = gemma2::gemma2_attention_options;
  family.qk_norm_options = gemma3_qk_norm;
  auto tiny = tiny_gemma_preset("gemma3_text", "Gemma3ForCausalLM");
  tiny.update({{"sliding_window", 8}, {"sliding_window_pattern", 2}, {"query_pre_attn_scalar", 16}});
  family.presets = {{"tiny-gemma3", tiny}};
  family.gguf = gemma_gguf_architecture("gemma3", gguf_config, gguf_metadata, traits);
  return family;
}

}  // namespace gemma3
}  // namespace torchpatch
