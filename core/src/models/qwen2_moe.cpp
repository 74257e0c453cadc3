// Qwen2-MoE and Qwen3-MoE: Hugging Face's defaults, class names and patch points on the shared
// decoder and MoE blocks.
#include "torchpatch/models/qwen2_moe.h"
#include "torchpatch/models/qwen3_moe.h"

#include "models/families.h"

namespace torchpatch::qwen2_moe {

const DecoderFamily kFamily{"Qwen2MoeDecoderLayer", "Qwen2MoeRMSNorm", "Qwen2MoeModel", "Qwen2MoeForCausalLM"};
const nn::DecoderLayerKeys kLayerKeys{"Qwen2MoeAttention", "Qwen2MoeMLP", "Qwen2MoeRMSNorm", "Qwen2MoeSparseMoeBlock"};
const nn::SparseMoeKeys kSparseKeys{"Qwen2MoeTopKRouter", "Qwen2MoeExperts", "Qwen2MoeMLP"};

}  // namespace torchpatch::qwen2_moe

namespace torchpatch::qwen3_moe {

const DecoderFamily kFamily{"Qwen3MoeDecoderLayer", "Qwen3MoeRMSNorm", "Qwen3MoeModel", "Qwen3MoeForCausalLM"};
const nn::DecoderLayerKeys kLayerKeys{"Qwen3MoeAttention", "Qwen3MoeMLP", "Qwen3MoeRMSNorm", "Qwen3MoeSparseMoeBlock"};
const nn::SparseMoeKeys kSparseKeys{"Qwen3MoeTopKRouter", "Qwen3MoeExperts", ""};

}  // namespace torchpatch::qwen3_moe

namespace torchpatch {

FamilyEntry qwen2_moe_family() {
  DecoderConfig d;  // Qwen2MoeConfig defaults
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
  auto family = decoder_family<qwen2_moe::Qwen2MoeForCausalLM, qwen2_moe::Qwen2MoeModel>("qwen2_moe",
                                                                                          qwen2_moe::kFamily, d);
  family.sliding = FamilyEntry::SlidingLayers::kFromMaxWindow;
  family.biases = FamilyEntry::Biases::kQkvOnly;
  family.moe = true;
  return family;
}

void add_qwen2_moe_builtins(std::map<std::string, ModuleClass>& classes) {
  using namespace qwen2_moe;
  add_decoder_builtins<Qwen2MoeAttention, Qwen2MoeMLP, Qwen2MoeRMSNorm, Qwen2MoeDecoderLayer>(classes, kFamily,
                                                                                              kLayerKeys);
  add_moe_builtins<Qwen2MoeSparseMoeBlock, Qwen2MoeTopKRouter, Qwen2MoeExperts>(classes, kLayerKeys, kSparseKeys);
}

FamilyEntry qwen3_moe_family() {
  DecoderConfig d;  // Qwen3MoeConfig defaults
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
  auto family = decoder_family<qwen3_moe::Qwen3MoeForCausalLM, qwen3_moe::Qwen3MoeModel>("qwen3_moe",
                                                                                          qwen3_moe::kFamily, d);
  family.sliding = FamilyEntry::SlidingLayers::kAllWhenUsed;
  family.moe = true;
  return family;
}

void add_qwen3_moe_builtins(std::map<std::string, ModuleClass>& classes) {
  using namespace qwen3_moe;
  add_decoder_builtins<Qwen3MoeAttention, Qwen3MoeMLP, Qwen3MoeRMSNorm, Qwen3MoeDecoderLayer>(classes, kFamily,
                                                                                              kLayerKeys);
  add_moe_builtins<Qwen3MoeSparseMoeBlock, Qwen3MoeTopKRouter, Qwen3MoeExperts>(classes, kLayerKeys, kSparseKeys);
}

}  // namespace torchpatch
