// Mistral: Llama's blocks with a sliding window on every layer, no biases, and a head_dim that may
// differ from hidden_size / num_attention_heads.
#include "torchpatch/models/mistral.h"

#include "models/families.h"

namespace torchpatch::mistral {

const DecoderFamily kFamily{"MistralDecoderLayer", "MistralRMSNorm", "MistralModel", "MistralForCausalLM"};
const nn::DecoderLayerKeys kLayerKeys{"MistralAttention", "MistralMLP", "MistralRMSNorm"};

}  // namespace torchpatch::mistral

namespace torchpatch {

FamilyEntry mistral_family() {
  DecoderConfig d;  // MistralConfig defaults
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
  auto family = decoder_family<mistral::MistralForCausalLM, mistral::MistralModel>("mistral", mistral::kFamily, d);
  family.sliding = FamilyEntry::SlidingLayers::kAll;
  family.biases = FamilyEntry::Biases::kNone;
  return family;
}

void add_mistral_builtins(std::map<std::string, ModuleClass>& classes) {
  using namespace mistral;
  add_decoder_builtins<MistralAttention, MistralMLP, MistralRMSNorm, MistralDecoderLayer>(classes, kFamily, kLayerKeys);
}

}  // namespace torchpatch
