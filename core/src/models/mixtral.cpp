// Mixtral: Mistral's attention with a sparse block in every layer: softmax routing over
// num_local_experts experts, the chosen top-k renormalised, no shared expert. Each expert is as wide
// as intermediate_size. The hub keeps the block as `block_sparse_moe` and an expert's projections as
// w1 (gate), w3 (up) and w2 (down): its experts layout, which the conversions read.
#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/models/decoder_family.h"
#include "torchpatch/nn/rms_norm.h"

namespace torchpatch::mixtral {

namespace {

const DecoderSpec& spec() {
  static const DecoderSpec spec{"MixtralAttention",      "",                  "MixtralRMSNorm",
                                "MixtralDecoderLayer",   "MixtralModel",      "MixtralForCausalLM",
                                "MixtralSparseMoeBlock", "MixtralTopKRouter", "MixtralExperts",
                                "",                      ExpertsLayout{"block_sparse_moe", "w1", "w3", "w2"}};
  return spec;
}

class MixtralAttention : public nn::GqaAttention {
 public:
  explicit MixtralAttention(const BuildContext& ctx) : GqaAttention(attention_options(model_config(ctx).decoder)) {}
};

class MixtralRMSNorm : public nn::RmsNorm {
 public:
  explicit MixtralRMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps) {}
};

class MixtralTopKRouter : public nn::TopKRouter {
 public:
  explicit MixtralTopKRouter(const BuildContext& ctx) : TopKRouter(router_options(model_config(ctx).decoder)) {}
};

class MixtralExperts : public nn::FusedExperts {
 public:
  explicit MixtralExperts(const BuildContext& ctx) : FusedExperts(experts_options(model_config(ctx).decoder)) {}
};

class MixtralSparseMoeBlock : public SparseMoeBlock {
 public:
  explicit MixtralSparseMoeBlock(const BuildContext& ctx) : SparseMoeBlock(ctx, spec()) {}
};

class MixtralDecoderLayer : public PreNormDecoderLayer {
 public:
  explicit MixtralDecoderLayer(const BuildContext& ctx) : PreNormDecoderLayer(ctx, spec()) {}
};

class MixtralModel : public DecoderModel {
 public:
  explicit MixtralModel(const BuildContext& ctx) : DecoderModel(ctx, spec()) {}
};

class MixtralForCausalLM : public DecoderForCausalLM {
 public:
  explicit MixtralForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}
};

// A "llama" file with experts, as llama.cpp's converter writes Mixtral: every layer sparse, each
// expert feed_forward_length wide, the chosen top-k renormalized (llama.cpp's llama graph), no window.
nlohmann::json gguf_config(const GgufMetadata& m) {
  auto c = gguf_decoder_config(m, "mixtral", "MixtralForCausalLM");
  c["num_local_experts"] = m.integer("expert_count");
  c["num_experts_per_tok"] = m.integer("expert_used_count");
  c["sliding_window"] = nullptr;
  return c;
}

// What the converter writes for Mixtral: the Llama keys with expert_count and expert_used_count.
// llama.cpp's "llama" has no sliding window, so a Mixtral with one is refused.
std::vector<std::pair<std::string, checkpoint::GgufValue>> gguf_metadata(const nlohmann::json& c,
                                                                        const DecoderTraits& traits) {
  const std::string source = "mixtral as GGUF architecture 'llama'";
  const auto window = c.value("sliding_window", nlohmann::json());
  if (window.is_number_integer() && window.get<int64_t>() > 0) {
    throw ConfigError(fmt::format("{}: sliding_window {}; llama.cpp's 'llama' attends to every position (set it to "
                                  "null)",
                                  source, window.get<int64_t>()));
  }
  auto m = gguf_decoder_metadata("llama", c);
  const auto moe = parse_decoder_config(c, source, traits).decoder.moe;
  for (auto& key : gguf_moe_metadata("llama", moe, /*normalized=*/true, source)) m.push_back(std::move(key));
  return m;
}

// Llama's names (q/k permuted: the converter's LlamaModel converts Mixtral) with the experts stacked
// in place of the dense MLP.
GgufArchitecture gguf_architecture(const DecoderTraits& traits) {
  GgufArchitecture a;
  a.names = {"llama"};
  a.accepts = [](const GgufMetadata& m) { return m.integer_or("expert_count").value_or(0) > 0; };
  a.config = gguf_config;
  for (auto& n : gguf_decoder_tensor_names(/*permuted_qk=*/true)) {
    if (n.gguf.rfind("blk.{}.ffn_", 0) != 0 || n.gguf == "blk.{}.ffn_norm.weight") a.tensors.push_back(std::move(n));
  }
  for (auto& n : gguf_expert_tensor_names("block_sparse_moe", "w1", "w3", "w2")) a.tensors.push_back(std::move(n));
  a.metadata = [traits](const nlohmann::json& c) { return gguf_metadata(c, traits); };
  return a;
}

}  // namespace

Family family() {
  DecoderTraits traits;  // MixtralConfig defaults
  auto& d = traits.defaults;
  d.vocab_size = 32000;
  d.hidden_size = 4096;
  d.intermediate_size = 14336;
  d.num_hidden_layers = 32;
  d.num_attention_heads = 32;
  d.num_key_value_heads = 8;
  d.max_position_embeddings = 4096 * 32;
  d.rms_norm_eps = 1e-5;
  d.moe.num_experts = 8;
  d.moe.num_experts_per_tok = 2;
  d.moe.norm_topk_prob = true;  // Mixtral always renormalises the chosen experts' weights
  traits.sliding = DecoderTraits::SlidingLayers::kAll;
  traits.biases = DecoderTraits::Biases::kNone;
  traits.moe = true;
  traits.expert_width_field = "intermediate_size";
  auto family = decoder_family<MixtralAttention, void, MixtralRMSNorm, MixtralDecoderLayer, MixtralModel,
                               MixtralForCausalLM>("mixtral", spec(), traits);
  add_moe_parts<MixtralSparseMoeBlock, MixtralTopKRouter, MixtralExperts>(family, spec());
  auto tiny = tiny_decoder_preset("mixtral", "MixtralForCausalLM");
  tiny.update({{"num_local_experts", 4}, {"num_experts_per_tok", 2}, {"rms_norm_eps", 1e-6}, {"rope_theta", 1e6}});
  family.presets = {{"tiny-mixtral", tiny}};
  family.gguf = gguf_architecture(traits);
  return family;
}

}  // namespace torchpatch::mixtral
