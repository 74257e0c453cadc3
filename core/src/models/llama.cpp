// Llama: Hugging Face's defaults, class names and patch points on the shared decoder blocks.
#include "torchpatch/models/llama.h"

#include "models/families.h"

namespace torchpatch::llama {

const DecoderFamily kFamily{"LlamaDecoderLayer", "LlamaRMSNorm", "LlamaModel", "LlamaForCausalLM"};
const nn::DecoderLayerKeys kLayerKeys{"LlamaAttention", "LlamaMLP", "LlamaRMSNorm"};

}  // namespace torchpatch::llama

namespace torchpatch {

FamilyEntry llama_family() {
  DecoderConfig d;  // LlamaConfig defaults
  d.vocab_size = 32000;
  d.hidden_size = 4096;
  d.intermediate_size = 11008;
  d.num_hidden_layers = 32;
  d.num_attention_heads = 32;
  d.num_key_value_heads = 0;  // None: as many as attention heads
  d.max_position_embeddings = 2048;
  d.rms_norm_eps = 1e-6;
  d.hidden_act = "silu";
  return decoder_family<llama::LlamaForCausalLM, llama::LlamaModel>("llama", llama::kFamily, d);
}

void add_llama_builtins(std::map<std::string, ModuleClass>& classes) {
  using namespace llama;
  add_decoder_builtins<LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaDecoderLayer>(classes, kFamily, kLayerKeys);
}

}  // namespace torchpatch
