// Llama: Hugging Face's defaults, class names and patch points on the shared decoder blocks.
#include "torchpatch/models/llama.h"

#include <fmt/format.h>

#include "torchpatch/models/decoder_family.h"

namespace torchpatch::llama {

const DecoderSpec& spec() {
  static const DecoderSpec spec{"LlamaAttention", "LlamaMLP",   "LlamaRMSNorm",
                                "LlamaDecoderLayer", "LlamaModel", "LlamaForCausalLM"};
  return spec;
}

Family family() {
  DecoderTraits traits;  // LlamaConfig defaults
  auto& d = traits.defaults;
  d.vocab_size = 32000;
  d.hidden_size = 4096;
  d.intermediate_size = 11008;
  d.num_hidden_layers = 32;
  d.num_attention_heads = 32;
  d.num_key_value_heads = 0;  // None: as many as attention heads
  d.max_position_embeddings = 2048;
  d.rms_norm_eps = 1e-6;
  d.hidden_act = "silu";
  auto family = decoder_family<LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaDecoderLayer, LlamaModel, LlamaForCausalLM>(
      "llama", spec(), traits);
  family.presets = {
      {"tiny-llama", tiny_decoder_preset("llama", "LlamaForCausalLM")},
      // A 125M Llama for benchmarks.
      {"llama-125m",
       {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", 32000}, {"hidden_size", 768},
        {"intermediate_size", 2048}, {"num_hidden_layers", 12}, {"num_attention_heads", 12},
        {"num_key_value_heads", 4}, {"max_position_embeddings", 2048}, {"rms_norm_eps", 1e-5},
        {"rope_theta", 10000.0}}},
      // Llama-3-8B's shapes with random weights: the GPU benchmark (16 GB in bfloat16).
      {"llama3-8b",
       {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", 128256}, {"hidden_size", 4096},
        {"intermediate_size", 14336}, {"num_hidden_layers", 32}, {"num_attention_heads", 32},
        {"num_key_value_heads", 8}, {"max_position_embeddings", 8192}, {"rms_norm_eps", 1e-5},
        {"rope_theta", 500000.0}, {"bos_token_id", 128000}, {"eos_token_id", 128001}}},
  };
  // llama.cpp's Llama converter permutes q and k rows for its interleaved RoPE; its Qwen ones do not.
  family.gguf = gguf_decoder_architecture("llama", "llama", "LlamaForCausalLM", /*permuted_qk=*/true);
  // llama.cpp's converter writes Mixtral as "llama" with experts: those files are Mixtral's (mixtral.cpp),
  // and a dense Llama never reads one without its MLPs.
  family.gguf->accepts = [](const GgufMetadata& m) { return m.integer_or("expert_count").value_or(0) == 0; };
  family.gguf->config = [dense = family.gguf->config](const GgufMetadata& m) {
    if (const auto experts = m.integer_or("expert_count"); experts && *experts > 0) {
      m.fail(m.full("expert_count"), fmt::format("{}: a mixture of experts, which the mixtral family reads (llama.cpp's "
                                                 "converter writes Mixtral as 'llama'), not the dense llama family",
                                                 *experts));
    }
    return dense(m);
  };
  return family;
}

}  // namespace torchpatch::llama
