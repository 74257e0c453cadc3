// phi3: the Phi-3 family (hf-semantics 5.9) as a plugin, on the core's decoder blocks. Its checkpoints
// store fused projections, and so do its modules: self_attn.qkv_proj [(nH + 2 nKV) * hd, H] (query
// heads, then keys, then values) and mlp.gate_up_proj [2 I, H] (gate, then up), so the hub layout
// loads and saves as it is. LongRoPE switches to its long factors per forward, and generation
// recomputes the sequence once when it first passes original_max_position_embeddings, as Hugging
// Face's Phi3ForCausalLM does.
#include <ATen/ATen.h>

#include "torchpatch/error.h"
#include "torchpatch/models/decoder_family.h"
#include "torchpatch/models/gguf_architecture.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/rms_norm.h"
#include "torchpatch/plugin_api.h"

namespace {

using namespace torchpatch;

const DecoderSpec& spec() {
  static const DecoderSpec spec{"Phi3Attention",    "Phi3MLP",   "Phi3RMSNorm",
                                "Phi3DecoderLayer", "Phi3Model", "Phi3ForCausalLM"};
  return spec;
}

// The shared fused block: Phi-3's checkpoints hold qkv_proj as the module does, so no conversion.
class Phi3Attention : public FusedQkvAttention {
 public:
  explicit Phi3Attention(const BuildContext& ctx)
      : FusedQkvAttention(attention_options(model_config(ctx).decoder)) {}
};

class Phi3MLP : public roles::Mlp {
 public:
  explicit Phi3MLP(const BuildContext& ctx) : act_(model_config(ctx).decoder.activation) {
    const auto& d = model_config(ctx).decoder;
    gate_up_proj = register_module("gate_up_proj", nn::make_linear("gate_up_proj", d.hidden_size, 2 * d.intermediate_size, false));
    down_proj = register_module("down_proj", nn::make_linear("down_proj", d.intermediate_size, d.hidden_size, false));
  }

  // down(up * act(gate)), gate and up the two halves of one projection
  at::Tensor forward(const at::Tensor& x) override {
    const auto gate_up = gate_up_proj->forward(x).chunk(2, -1);
    return down_proj->forward(gate_up[1] * nn::activate(act_, gate_up[0]));
  }

  std::shared_ptr<roles::Linear> gate_up_proj, down_proj;

 private:
  nn::Activation act_;
};

class Phi3RMSNorm : public nn::RmsNorm {
 public:
  explicit Phi3RMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps) {}
};

class Phi3DecoderLayer : public PreNormDecoderLayer {
 public:
  explicit Phi3DecoderLayer(const BuildContext& ctx) : PreNormDecoderLayer(ctx, spec()) {}
};

class Phi3Model : public DecoderModel {
 public:
  explicit Phi3Model(const BuildContext& ctx) : DecoderModel(ctx, spec()) {}
};

class Phi3ForCausalLM : public DecoderForCausalLM {
 public:
  explicit Phi3ForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}

  // Hugging Face tests the whole (padded) length, so a short row of a batch switches with the batch.
  bool recompute_at(int64_t sequence_length, int64_t cached_length) const override {
    const auto& rope = config().decoder.rope;
    const int64_t original = rope.original_max_position_embeddings;
    return rope.kind == nn::RopeKind::kLongrope && sequence_length >= original + 1 && cached_length <= original;
  }
};

// Phi3Config reads rope_scaling {"type": "longrope" (or the older "su" / "yarn"), "short_factor",
// "long_factor"} and keeps original_max_position_embeddings at the top level.
ModelConfig parse_phi3(nlohmann::json j, const std::string& source, const DecoderTraits& traits) {
  auto scaling = j.find("rope_scaling");
  if (scaling != j.end() && scaling->is_object()) {
    const auto type = scaling->value("type", scaling->value("rope_type", std::string()));
    if (type != "longrope" && type != "su" && type != "yarn") {
      throw ConfigError(source + ": rope_scaling type '" + type + "' is not one Phi-3 knows (longrope, su, yarn)");
    }
    for (const auto& [key, value] : scaling->items()) {
      if (key != "type" && key != "rope_type" && key != "short_factor" && key != "long_factor") {
        throw ConfigError(source + ": rope_scaling holds '" + key +
                          "'; Phi-3's has exactly type, short_factor and long_factor");
      }
    }
    (*scaling)["rope_type"] = "longrope";
    scaling->erase("type");
    if (!j.contains("original_max_position_embeddings")) j["original_max_position_embeddings"] = 4096;
  }
  auto config = parse_decoder_config(j, source, traits);
  config.raw = j;
  return config;
}

// llama.cpp's "phi3" (its Phi3MiniModel converter): the fused projections as they are (attn_qkv,
// ffn_up holding gate then up; its graph splits them), q/k rows as Hugging Face's, and keys of its
// own: rope.scaling.original_context_length, attention.sliding_window (0: none), no key or value
// length. LongRoPE's factors travel as tensors (rope_factors_long / _short), not read or written yet.
nlohmann::json gguf_config(const GgufMetadata& m) {
  if (m.file().find("rope_factors_long.weight") != nullptr) {
    throw ConfigError(m.file().path().string() +
                      ": tensor 'rope_factors_long.weight': the file's RoPE is LongRoPE (a 128k-context Phi-3), "
                      "whose factors torchpatch does not read from GGUF files yet; load the Hugging Face checkpoint");
  }
  auto c = gguf_decoder_config(m, "phi3", "Phi3ForCausalLM");
  c["original_max_position_embeddings"] =
      m.integer_or("rope.scaling.original_context_length").value_or(c["max_position_embeddings"].get<int64_t>());
  const auto window = m.integer_or("attention.sliding_window").value_or(0);
  c["sliding_window"] = window > 0 ? nlohmann::json(window) : nlohmann::json(nullptr);
  return c;
}

std::vector<std::pair<std::string, checkpoint::GgufValue>> gguf_metadata(const nlohmann::json& c) {
  if (const auto scaling = gguf_full_attention_rope(c); scaling.is_object()) {
    throw ConfigError("phi3 as GGUF architecture 'phi3': rope_scaling (LongRoPE's factors are tensors in GGUF files, "
                      "which torchpatch does not write yet)");
  }
  std::vector<std::pair<std::string, checkpoint::GgufValue>> m;
  for (auto& [key, value] : gguf_decoder_metadata("phi3", c)) {
    if (key != "phi3.attention.key_length" && key != "phi3.attention.value_length" && key != "phi3.vocab_size") {
      m.emplace_back(std::move(key), std::move(value));
    }
  }
  const auto original = c.value("original_max_position_embeddings", c.value("max_position_embeddings", int64_t{0}));
  const auto window = c.contains("sliding_window") && c["sliding_window"].is_number_integer()
                          ? c["sliding_window"].get<int64_t>()
                          : int64_t{0};
  m.emplace_back("phi3.rope.scaling.original_context_length", checkpoint::GgufValue::of(static_cast<uint32_t>(original)));
  m.emplace_back("phi3.attention.sliding_window", checkpoint::GgufValue::of(static_cast<uint32_t>(window)));
  return m;
}

GgufArchitecture gguf_architecture() {
  GgufArchitecture a;
  a.names = {"phi3"};
  a.config = gguf_config;
  for (auto& name : gguf_decoder_tensor_names(/*permuted_qk=*/false)) {
    const auto& hub = name.hub;
    const bool split = hub.find("q_proj") != std::string::npos || hub.find("k_proj") != std::string::npos ||
                       hub.find("v_proj") != std::string::npos || hub.find("gate_proj") != std::string::npos ||
                       hub.find("up_proj") != std::string::npos || hub.find("_norm.") != std::string::npos;
    if (!split) a.tensors.push_back(std::move(name));
  }
  a.tensors.push_back({"blk.{}.attn_qkv.weight", "model.layers.{}.self_attn.qkv_proj.weight", GgufTensorTransform::kNone,
                       /*projection=*/true});
  a.tensors.push_back({"blk.{}.ffn_up.weight", "model.layers.{}.mlp.gate_up_proj.weight", GgufTensorTransform::kNone,
                       /*projection=*/true});
  a.metadata = gguf_metadata;
  return a;
}

Family phi3_family() {
  DecoderTraits traits;  // Phi3Config defaults
  auto& d = traits.defaults;
  d.vocab_size = 32064;
  d.hidden_size = 3072;
  d.intermediate_size = 8192;
  d.num_hidden_layers = 32;
  d.num_attention_heads = 32;
  d.num_key_value_heads = 0;  // None: as many as attention heads
  d.max_position_embeddings = 4096;
  d.rms_norm_eps = 1e-5;
  d.hidden_act = "silu";
  traits.biases = DecoderTraits::Biases::kNone;
  auto family = decoder_family<Phi3Attention, Phi3MLP, Phi3RMSNorm, Phi3DecoderLayer, Phi3Model, Phi3ForCausalLM>(
      "phi3", spec(), traits);
  family.parse_config = [traits](const nlohmann::json& j, const std::string& source) { return parse_phi3(j, source, traits); };
  for (auto& point : family.patch_points) {
    if (point.name == "Phi3MLP") point.kind = block_kind::kFusedMlp;  // one gate_up_proj, split by column halves
    point.devices = {c10::kCPU, c10::kCUDA};                            // LibTorch's operations only
  }
  auto tiny = tiny_decoder_preset("phi3", "Phi3ForCausalLM");
  tiny["original_max_position_embeddings"] = 256;
  family.presets = {{"tiny-phi3", tiny}};
  family.gguf = gguf_architecture();
  return family;
}

void register_plugin(Registrar& registrar) { registrar.add_family(phi3_family()); }

}  // namespace

TORCHPATCH_PLUGIN("phi3", "1.0.0", register_plugin)
