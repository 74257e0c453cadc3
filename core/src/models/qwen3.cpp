// Qwen3 (dense): Qwen3-MoE's attention (per-head q/k RMSNorm, explicit head_dim) on Llama's dense
// layers; sliding-window layers as Qwen2 chooses them (`use_sliding_window`, then `layer_types` or
// `max_window_layers`); q/k/v/o biases from `attention_bias`.
#include "torchpatch/models/qwen3.h"

#include "torchpatch/models/decoder_family.h"

namespace torchpatch::qwen3 {

const DecoderSpec& spec() {
  static const DecoderSpec spec{"Qwen3Attention",    "Qwen3MLP",   "Qwen3RMSNorm",
                                "Qwen3DecoderLayer", "Qwen3Model", "Qwen3ForCausalLM"};
  return spec;
}

Family family() {
  DecoderTraits traits;  // Qwen3Config defaults
  auto& d = traits.defaults;
  d.vocab_size = 151936;
  d.hidden_size = 4096;
  d.intermediate_size = 22016;
  d.num_hidden_layers = 32;
  d.num_attention_heads = 32;
  d.num_key_value_heads = 32;
  d.head_dim = 128;
  d.max_position_embeddings = 32768;
  d.rms_norm_eps = 1e-6;
  d.hidden_act = "silu";
  d.sliding_window = 4096;  // used only with use_sliding_window
  d.qk_norm = true;
  traits.sliding = DecoderTraits::SlidingLayers::kFromMaxWindow;
  traits.fixed_head_dim = true;
  auto family = decoder_family<Qwen3Attention, Qwen3MLP, Qwen3RMSNorm, Qwen3DecoderLayer, Qwen3Model, Qwen3ForCausalLM>(
      "qwen3", spec(), traits);
  auto tiny = tiny_decoder_preset("qwen3", "Qwen3ForCausalLM");
  tiny.update({{"head_dim", 32}, {"tie_word_embeddings", true}, {"rms_norm_eps", 1e-6}});
  family.presets = {{"tiny-qwen3", tiny}};
  family.gguf = gguf_decoder_architecture("qwen3", "qwen3", "Qwen3ForCausalLM", /*permuted_qk=*/false);
  return family;
}

}  // namespace torchpatch::qwen3
