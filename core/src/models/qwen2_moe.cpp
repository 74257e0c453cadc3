// Qwen2-MoE and Qwen3-MoE: Hugging Face's defaults, class names and patch points on the shared
// decoder and MoE blocks.
#include "torchpatch/models/qwen2_moe.h"
#include "torchpatch/models/qwen3_moe.h"

#include "torchpatch/models/decoder_family.h"

namespace torchpatch::qwen2_moe {

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
  return family;
}

}  // namespace torchpatch::qwen2_moe

namespace torchpatch::qwen3_moe {

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
  return family;
}

}  // namespace torchpatch::qwen3_moe
