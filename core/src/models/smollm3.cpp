// SmolLM3: Llama's layers, but some without positions (NoPE): `no_rope_layers[i]` is 1 where layer i
// applies RoPE and 0 where it does not; absent, every `no_rope_layer_interval`-th layer goes without.
// Sliding layers as Qwen2 chooses them (`use_sliding_window`, then `layer_types`).
#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/models/decoder_family.h"
#include "torchpatch/printable.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch::smollm3 {

namespace {

const DecoderSpec& spec() {
  static const DecoderSpec spec{"SmolLM3Attention",    "SmolLM3MLP",   "SmolLM3RMSNorm",
                                "SmolLM3DecoderLayer", "SmolLM3Model", "SmolLM3ForCausalLM"};
  return spec;
}

/// SmolLM3Config's own field: which layers apply RoPE.
struct SmolLM3Config : FamilyFields {
  std::vector<int64_t> no_rope_layers;  ///< 1: the layer applies RoPE; 0: it does not
  void to_json(nlohmann::json& j) const override { j["no_rope_layers"] = no_rope_layers; }
};

class SmolLM3Attention : public nn::GqaAttention {
 public:
  explicit SmolLM3Attention(const BuildContext& ctx) : GqaAttention(attention_options(model_config(ctx).decoder)) {}
};

class SmolLM3MLP : public nn::GatedMlp {
 public:
  explicit SmolLM3MLP(const BuildContext& ctx) : GatedMlp(mlp_options(ctx)) {}
};

class SmolLM3RMSNorm : public nn::RmsNorm {
 public:
  explicit SmolLM3RMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps) {}
};

class SmolLM3DecoderLayer : public PreNormDecoderLayer {
 public:
  explicit SmolLM3DecoderLayer(const BuildContext& ctx)
      : PreNormDecoderLayer(ctx, spec()),
        use_rope_(model_config(ctx).family_fields<SmolLM3Config>().no_rope_layers.at(ctx.layer_idx) != 0) {}

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const AttentionInputs& inputs) override {
    if (use_rope_) return PreNormDecoderLayer::forward_impl(hidden, inputs);
    AttentionInputs without_positions = inputs;  // undefined tables: the attention skips RoPE
    without_positions.cos = at::Tensor();
    without_positions.sin = at::Tensor();
    return PreNormDecoderLayer::forward_impl(hidden, without_positions);
  }

 private:
  bool use_rope_;
};

class SmolLM3Model : public DecoderModel {
 public:
  explicit SmolLM3Model(const BuildContext& ctx) : DecoderModel(ctx, spec()) {}
};

class SmolLM3ForCausalLM : public DecoderForCausalLM {
 public:
  explicit SmolLM3ForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}
};

std::vector<int64_t> read_no_rope_layers(const ConfigReader& f, int64_t layers) {
  std::vector<int64_t> flags;
  if (!f.has("no_rope_layers")) {
    const int64_t interval = f.positive("no_rope_layer_interval", 4);
    for (int64_t i = 0; i < layers; ++i) flags.push_back((i + 1) % interval != 0 ? 1 : 0);
    return flags;
  }
  const auto& list = f.json().at("no_rope_layers");
  if (!list.is_array() || static_cast<int64_t>(list.size()) != layers) {
    f.fail(fmt::format("field 'no_rope_layers' must be a list of one 0 or 1 per layer ({} layers), got {}", layers,
                       printable(list.dump(), 200)));
  }
  for (const auto& flag : list) {
    if (!flag.is_number_integer() || (flag.get<int64_t>() != 0 && flag.get<int64_t>() != 1)) {
      f.fail(fmt::format("field 'no_rope_layers' holds {}; each entry is 1 (RoPE) or 0 (none)", printable(flag.dump(), 50)));
    }
    flags.push_back(flag.get<int64_t>());
  }
  return flags;
}

// llama.cpp's smollm3 has no key for the layers without RoPE: every 4th goes without.
constexpr int64_t kLlamaCppNoRopeInterval = 4;

nlohmann::json gguf_config(const GgufMetadata& m) {
  auto c = gguf_decoder_config(m, "smollm3", "SmolLM3ForCausalLM");
  c["no_rope_layer_interval"] = kLlamaCppNoRopeInterval;
  return c;
}

// Refuses layers without RoPE other than llama.cpp's every 4th (sliding windows are refused by the
// decoder's metadata).
std::vector<std::pair<std::string, checkpoint::GgufValue>> gguf_metadata(const nlohmann::json& c) {
  const auto layers = c.value("num_hidden_layers", int64_t{0});
  const auto flags = read_no_rope_layers(ConfigReader(c, "smollm3 as GGUF architecture 'smollm3'"), layers);
  for (int64_t i = 0; i < layers; ++i) {
    const int64_t expected = (i + 1) % kLlamaCppNoRopeInterval != 0 ? 1 : 0;
    if (flags[i] != expected) {
      throw ConfigError(fmt::format("smollm3 as GGUF architecture 'smollm3': no_rope_layers[{}] is {}, but llama.cpp's "
                                    "smollm3 applies RoPE in all layers but every {}th and has no key for others",
                                    i, flags[i], kLlamaCppNoRopeInterval));
    }
  }
  return gguf_decoder_metadata("smollm3", c);
}

// Llama's tensors, q and k rows permuted (llama.cpp converts SmolLM3 as a Llama).
GgufArchitecture gguf_architecture() {
  GgufArchitecture a;
  a.names = {"smollm3"};
  a.config = gguf_config;
  a.tensors = gguf_decoder_tensor_names(/*permuted_qk=*/true);
  a.metadata = gguf_metadata;
  return a;
}

}  // namespace

Family family() {
  DecoderTraits traits;  // SmolLM3Config defaults
  auto& d = traits.defaults;
  d.vocab_size = 128256;
  d.hidden_size = 2048;
  d.intermediate_size = 11008;
  d.num_hidden_layers = 36;
  d.num_attention_heads = 16;
  d.num_key_value_heads = 4;
  d.max_position_embeddings = 32768;
  d.rms_norm_eps = 1e-6;
  d.tie_word_embeddings = true;
  d.sliding_window = 4096;  // used only with use_sliding_window
  traits.sliding = DecoderTraits::SlidingLayers::kFromMaxWindow;
  auto family = decoder_family<SmolLM3Attention, SmolLM3MLP, SmolLM3RMSNorm, SmolLM3DecoderLayer, SmolLM3Model,
                               SmolLM3ForCausalLM>("smollm3", spec(), traits);
  family.parse_config = [traits](const nlohmann::json& j, const std::string& source) {
    auto config = parse_decoder_config(j, source, traits);
    auto own = std::make_shared<SmolLM3Config>();
    own->no_rope_layers = read_no_rope_layers(ConfigReader(j, source), config.decoder.num_hidden_layers);
    config.fields = std::move(own);
    return config;
  };
  auto tiny = tiny_decoder_preset("smollm3", "SmolLM3ForCausalLM");
  tiny.update({{"num_hidden_layers", 4}, {"no_rope_layer_interval", 4}, {"rope_theta", 2e6}, {"rms_norm_eps", 1e-6}});
  family.presets = {{"tiny-smollm3", tiny}};
  family.gguf = gguf_architecture();
  return family;
}

}  // namespace torchpatch::smollm3
