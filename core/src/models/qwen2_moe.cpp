// Qwen2-MoE and Qwen3-MoE: Hugging Face's defaults, class names and patch points on the shared
// decoder and MoE blocks.
#include "torchpatch/models/qwen2_moe.h"
#include "torchpatch/models/qwen3_moe.h"

#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/models/decoder_family.h"

namespace torchpatch {

namespace {

// An expert's width in a "qwen2moe" or "qwen3moe" file: expert_feed_forward_length, else what
// llama.cpp takes without it, feed_forward_length / expert_used_count.
int64_t gguf_expert_width(const GgufMetadata& m, const nlohmann::json& c) {
  if (const auto width = m.integer_or("expert_feed_forward_length")) return *width;
  const auto used = c["num_experts_per_tok"].get<int64_t>();
  if (used <= 0) m.fail(m.full("expert_used_count"), fmt::format("{}, not a positive number of experts", used));
  return c["intermediate_size"].get<int64_t>() / used;
}

// What llama.cpp's Qwen MoE converters write for `c` (whose expert fields, defaults filled in, are
// `moe`): the usual keys, the experts' and their width; `normalized` is the norm_topk_prob llama.cpp's
// graph of `arch` runs.
std::vector<std::pair<std::string, checkpoint::GgufValue>> gguf_qwen_moe_metadata(const std::string& arch,
                                                                                 const nlohmann::json& c,
                                                                                 const MoeConfig& moe,
                                                                                 bool normalized) {
  const auto source = fmt::format("{} as GGUF architecture '{}'", c.value("model_type", std::string()), arch);
  auto m = gguf_decoder_metadata(arch, c);
  for (auto& key : gguf_moe_metadata(arch, moe, normalized, source)) m.push_back(std::move(key));
  m.emplace_back(arch + ".expert_feed_forward_length",
                 checkpoint::GgufValue::of(static_cast<uint32_t>(moe.moe_intermediate_size)));
  return m;
}

}  // namespace

namespace qwen2_moe {

namespace {

// A "qwen2moe" file as llama.cpp runs it: every layer sparse, the top-k weights as the softmax gives
// them (not renormalized), and a shared expert as wide as expert_shared_feed_forward_length (else
// feed_forward_length) gated by sigmoid(ffn_gate_inp_shexp).
nlohmann::json gguf_config(const GgufMetadata& m) {
  auto c = gguf_decoder_config(m, "qwen2_moe", "Qwen2MoeForCausalLM");
  gguf_moe_config(m, c, /*normalized=*/false);
  c["moe_intermediate_size"] = gguf_expert_width(m, c);
  c["shared_expert_intermediate_size"] =
      m.integer_or("expert_shared_feed_forward_length").value_or(c["intermediate_size"].get<int64_t>());
  return c;
}

std::vector<std::pair<std::string, checkpoint::GgufValue>> gguf_metadata(const nlohmann::json& c,
                                                                        const DecoderTraits& traits) {
  const auto moe = parse_decoder_config(c, "qwen2_moe as GGUF architecture 'qwen2moe'", traits).decoder.moe;
  if (moe.shared_expert_intermediate_size <= 0) {
    throw ConfigError("qwen2_moe as GGUF architecture 'qwen2moe': no shared expert (shared_expert_intermediate_size "
                      "0); llama.cpp's qwen2moe requires one (Qwen3-MoE's 'qwen3moe' has none)");
  }
  auto m = gguf_qwen_moe_metadata("qwen2moe", c, moe, /*normalized=*/false);
  m.emplace_back("qwen2moe.expert_shared_feed_forward_length",
                 checkpoint::GgufValue::of(static_cast<uint32_t>(moe.shared_expert_intermediate_size)));
  return m;
}

// Qwen2's tensors, the experts stacked, and the shared expert: blk.N.ffn_gate_shexp / ffn_up_shexp /
// ffn_down_shexp and its gate, ffn_gate_inp_shexp ([1, hidden], as the hub's shared_expert_gate).
GgufArchitecture gguf_architecture(const DecoderTraits& traits) {
  constexpr bool kProjection = true;
  GgufArchitecture a;
  a.names = {"qwen2moe"};
  a.config = gguf_config;
  a.tensors = gguf_decoder_tensor_names(/*permuted_qk=*/false);
  for (auto& n : gguf_expert_tensor_names()) a.tensors.push_back(std::move(n));
  a.tensors.push_back({"blk.{}.ffn_gate_shexp.weight", "model.layers.{}.mlp.shared_expert.gate_proj.weight",
                       GgufTensorTransform::kNone, kProjection});
  a.tensors.push_back({"blk.{}.ffn_up_shexp.weight", "model.layers.{}.mlp.shared_expert.up_proj.weight",
                       GgufTensorTransform::kNone, kProjection});
  a.tensors.push_back({"blk.{}.ffn_down_shexp.weight", "model.layers.{}.mlp.shared_expert.down_proj.weight",
                       GgufTensorTransform::kNone, kProjection});
  // A projection too (a Linear of one row): where the file holds it in float, as llama-quantize leaves
  // it, a quantized model keeps it in float.
  a.tensors.push_back({"blk.{}.ffn_gate_inp_shexp.weight", "model.layers.{}.mlp.shared_expert_gate.weight",
                       GgufTensorTransform::kNone, kProjection});
  a.metadata = [traits](const nlohmann::json& c) { return gguf_metadata(c, traits); };
  return a;
}

}  // namespace

const DecoderSpec& spec() {
  static const DecoderSpec spec{"Qwen2MoeAttention",      "Qwen2MoeMLP",      "Qwen2MoeRMSNorm",
                                "Qwen2MoeDecoderLayer",   "Qwen2MoeModel",    "Qwen2MoeForCausalLM",
                                "Qwen2MoeSparseMoeBlock", "Qwen2MoeTopKRouter", "Qwen2MoeExperts",
                                "Qwen2MoeMLP"};
  return spec;
}

Family family() {
  DecoderTraits traits;  // Qwen2MoeConfig defaults
  auto& d = traits.defaults;
  d.vocab_size = 151936;
  d.hidden_size = 2048;
  d.intermediate_size = 5632;
  d.num_hidden_layers = 24;
  d.num_attention_heads = 16;
  d.num_key_value_heads = 16;
  d.max_position_embeddings = 32768;
  d.rms_norm_eps = 1e-6;
  d.sliding_window = 4096;  // used only with use_sliding_window
  d.moe.num_experts = 60;
  d.moe.num_experts_per_tok = 4;
  d.moe.moe_intermediate_size = 1408;
  d.moe.shared_expert_intermediate_size = 5632;
  traits.sliding = DecoderTraits::SlidingLayers::kFromMaxWindow;
  traits.biases = DecoderTraits::Biases::kQkvOnly;
  traits.moe = true;
  auto family = decoder_family<Qwen2MoeAttention, Qwen2MoeMLP, Qwen2MoeRMSNorm, Qwen2MoeDecoderLayer, Qwen2MoeModel,
                               Qwen2MoeForCausalLM>("qwen2_moe", spec(), traits);
  add_moe_parts<Qwen2MoeSparseMoeBlock, Qwen2MoeTopKRouter, Qwen2MoeExperts>(family, spec());
  family.presets = {
      {"qwen2-moe-125m",
       {{"architectures", {"Qwen2MoeForCausalLM"}}, {"model_type", "qwen2_moe"}, {"vocab_size", 32000},
        {"hidden_size", 512}, {"intermediate_size", 1408}, {"num_hidden_layers", 8}, {"num_attention_heads", 8},
        {"num_key_value_heads", 8}, {"max_position_embeddings", 2048}, {"rms_norm_eps", 1e-6},
        {"num_experts", 16}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 384},
        {"shared_expert_intermediate_size", 768}, {"norm_topk_prob", false}, {"rope_theta", 1000000.0}}},
  };
  family.gguf = gguf_architecture(traits);
  return family;
}

}  // namespace qwen2_moe

namespace qwen3_moe {

namespace {

// A "qwen3moe" file as llama.cpp runs it: every layer sparse, the top-k weights renormalized, no
// shared expert.
nlohmann::json gguf_config(const GgufMetadata& m) {
  auto c = gguf_decoder_config(m, "qwen3_moe", "Qwen3MoeForCausalLM");
  gguf_moe_config(m, c, /*normalized=*/true);
  c["moe_intermediate_size"] = gguf_expert_width(m, c);
  return c;
}

// Qwen3's tensors (q/k norms per head) and the experts stacked.
GgufArchitecture gguf_architecture(const DecoderTraits& traits) {
  GgufArchitecture a;
  a.names = {"qwen3moe"};
  a.config = gguf_config;
  a.tensors = gguf_decoder_tensor_names(/*permuted_qk=*/false);
  for (auto& n : gguf_expert_tensor_names()) a.tensors.push_back(std::move(n));
  a.metadata = [traits](const nlohmann::json& c) {
    const auto moe = parse_decoder_config(c, "qwen3_moe as GGUF architecture 'qwen3moe'", traits).decoder.moe;
    return gguf_qwen_moe_metadata("qwen3moe", c, moe, /*normalized=*/true);
  };
  return a;
}

}  // namespace

const DecoderSpec& spec() {
  static const DecoderSpec spec{"Qwen3MoeAttention",      "Qwen3MoeMLP",        "Qwen3MoeRMSNorm",
                                "Qwen3MoeDecoderLayer",   "Qwen3MoeModel",      "Qwen3MoeForCausalLM",
                                "Qwen3MoeSparseMoeBlock", "Qwen3MoeTopKRouter", "Qwen3MoeExperts",
                                ""};
  return spec;
}

Family family() {
  DecoderTraits traits;  // Qwen3MoeConfig defaults
  auto& d = traits.defaults;
  d.vocab_size = 151936;
  d.hidden_size = 2048;
  d.intermediate_size = 6144;
  d.num_hidden_layers = 24;
  d.num_attention_heads = 32;
  d.num_key_value_heads = 4;
  d.max_position_embeddings = 32768;
  d.rms_norm_eps = 1e-6;
  d.sliding_window = 4096;  // used only with use_sliding_window
  d.qk_norm = true;
  d.moe.num_experts = 128;
  d.moe.num_experts_per_tok = 8;
  d.moe.moe_intermediate_size = 768;
  traits.sliding = DecoderTraits::SlidingLayers::kAllWhenUsed;
  traits.moe = true;
  auto family = decoder_family<Qwen3MoeAttention, Qwen3MoeMLP, Qwen3MoeRMSNorm, Qwen3MoeDecoderLayer, Qwen3MoeModel,
                               Qwen3MoeForCausalLM>("qwen3_moe", spec(), traits);
  add_moe_parts<Qwen3MoeSparseMoeBlock, Qwen3MoeTopKRouter, Qwen3MoeExperts>(family, spec());
  family.gguf = gguf_architecture(traits);
  return family;
}

}  // namespace qwen3_moe

}  // namespace torchpatch
