// Qwen2: Llama's blocks with biases on q/k/v (not o), and sliding-window layers chosen by
// `use_sliding_window` with `layer_types` or `max_window_layers`.
#include "torchpatch/models/qwen2.h"

#include "torchpatch/models/decoder_family.h"

namespace torchpatch::qwen2 {

const DecoderSpec& spec() {
  static const DecoderSpec spec{"Qwen2Attention",    "Qwen2MLP",   "Qwen2RMSNorm",
                                "Qwen2DecoderLayer", "Qwen2Model", "Qwen2ForCausalLM"};
  return spec;
}

Family family() {
  DecoderTraits traits;  // Qwen2Config defaults
  auto& d = traits.defaults;
  d.vocab_size = 151936;
  d.hidden_size = 4096;
  d.intermediate_size = 22016;
  d.num_hidden_layers = 32;
  d.num_attention_heads = 32;
  d.num_key_value_heads = 32;
  d.max_position_embeddings = 32768;
  d.rms_norm_eps = 1e-6;
  d.hidden_act = "silu";
  d.sliding_window = 4096;  // used only with use_sliding_window
  traits.sliding = DecoderTraits::SlidingLayers::kFromMaxWindow;
  traits.biases = DecoderTraits::Biases::kQkvOnly;
  auto family = decoder_family<Qwen2Attention, Qwen2MLP, Qwen2RMSNorm, Qwen2DecoderLayer, Qwen2Model, Qwen2ForCausalLM>(
      "qwen2", spec(), traits);
  auto tiny = tiny_decoder_preset("qwen2", "Qwen2ForCausalLM");
  tiny.update({{"use_sliding_window", true}, {"sliding_window", 8}, {"max_window_layers", 1}});
  family.presets = {{"tiny-qwen2", tiny}};
  family.gguf = gguf_decoder_architecture("qwen2", "qwen2", "Qwen2ForCausalLM", /*permuted_qk=*/false);
  return family;
}

}  // namespace torchpatch::qwen2
