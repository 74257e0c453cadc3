// Mistral: Llama's blocks with a sliding window on every layer, no biases, and a head_dim that may
// differ from hidden_size / num_attention_heads.
#include "torchpatch/models/mistral.h"

#include "torchpatch/models/decoder_family.h"

namespace torchpatch::mistral {

const DecoderSpec& spec() {
  static const DecoderSpec spec{"MistralAttention",    "MistralMLP",   "MistralRMSNorm",
                                "MistralDecoderLayer", "MistralModel", "MistralForCausalLM"};
  return spec;
}

Family family() {
  DecoderTraits traits;  // MistralConfig defaults
  auto& d = traits.defaults;
  d.vocab_size = 32000;
  d.hidden_size = 4096;
  d.intermediate_size = 14336;
  d.num_hidden_layers = 32;
  d.num_attention_heads = 32;
  d.num_key_value_heads = 8;
  d.max_position_embeddings = 4096 * 32;
  d.rms_norm_eps = 1e-6;
  d.hidden_act = "silu";
  d.sliding_window = 4096;
  traits.sliding = DecoderTraits::SlidingLayers::kAll;
  traits.biases = DecoderTraits::Biases::kNone;
  auto family = decoder_family<MistralAttention, MistralMLP, MistralRMSNorm, MistralDecoderLayer, MistralModel,
                               MistralForCausalLM>("mistral", spec(), traits);
  auto tiny = tiny_decoder_preset("mistral", "MistralForCausalLM");
  tiny["sliding_window"] = 8;
  family.presets = {{"tiny-mistral", tiny}};
  return family;
}

}  // namespace torchpatch::mistral
