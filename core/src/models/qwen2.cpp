// Qwen2: Llama's blocks with biases on q/k/v (not o), and sliding-window layers chosen by
// `use_sliding_window` with `layer_types` or `max_window_layers`.
#include "torchpatch/models/qwen2.h"

#include "models/families.h"

namespace torchpatch::qwen2 {

const DecoderFamily kFamily{"Qwen2DecoderLayer", "Qwen2RMSNorm", "Qwen2Model", "Qwen2ForCausalLM"};
const nn::DecoderLayerKeys kLayerKeys{"Qwen2Attention", "Qwen2MLP", "Qwen2RMSNorm"};

}  // namespace torchpatch::qwen2

namespace torchpatch {

FamilyEntry qwen2_family() {
  DecoderConfig d;  // Qwen2Config defaults
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
  auto family = decoder_family<qwen2::Qwen2ForCausalLM, qwen2::Qwen2Model>("qwen2", qwen2::kFamily, d);
  family.sliding = FamilyEntry::SlidingLayers::kFromMaxWindow;
  family.biases = FamilyEntry::Biases::kQkvOnly;
  return family;
}

void add_qwen2_builtins(std::map<std::string, ModuleClass>& classes) {
  using namespace qwen2;
  add_decoder_builtins<Qwen2Attention, Qwen2MLP, Qwen2RMSNorm, Qwen2DecoderLayer>(classes, kFamily, kLayerKeys);
}

}  // namespace torchpatch
