// Llama: Hugging Face's defaults, class names and patch points on the shared decoder blocks.
#include "torchpatch/models/llama.h"

#include "models/families.h"

namespace torchpatch::llama {

const DecoderFamily kFamily{"LlamaDecoderLayer", "LlamaRMSNorm", "LlamaModel", "LlamaForCausalLM"};
const nn::DecoderLayerKeys kLayerKeys{"LlamaAttention", "LlamaMLP", "LlamaRMSNorm"};

}  // namespace torchpatch::llama

namespace torchpatch {

FamilyEntry llama_family() {
  FamilyEntry family;
  family.model_type = "llama";
  DecoderConfig& d = family.defaults;  // LlamaConfig defaults
  d.vocab_size = 32000;
  d.hidden_size = 4096;
  d.intermediate_size = 11008;
  d.num_hidden_layers = 32;
  d.num_attention_heads = 32;
  d.max_position_embeddings = 2048;
  d.rms_norm_eps = 1e-6;
  d.hidden_act = "silu";
  family.default_class = "LlamaForCausalLM";
  family.classes["LlamaForCausalLM"] = [](const ModelConfig& c) { return std::make_shared<llama::LlamaForCausalLM>(c); };
  family.classes["LlamaModel"] = [](const ModelConfig& c) { return std::make_shared<llama::LlamaModel>(c); };
  return family;
}

void add_llama_builtins(std::map<std::string, ModuleClass>& classes) {
  for (auto cls : {module_class<llama::LlamaAttention>("LlamaAttention"), module_class<llama::LlamaMLP>("LlamaMLP"),
                   module_class<llama::LlamaRMSNorm>("LlamaRMSNorm"),
                   module_class<llama::LlamaDecoderLayer>("LlamaDecoderLayer")}) {
    classes.emplace(cls.name, cls);
  }
}

}  // namespace torchpatch
