// A decoder family's class names, in a header of its own: the family descriptor (family.h) and the
// shared blocks (blocks.h) both name them.
#pragma once

#include <string>

#include "torchpatch/export.h"

namespace torchpatch {

/// Where a MoE family's experts sit in its hub checkpoints: the sparse block's module name and each
/// expert's projections, `{block}.experts.{e}.{gate|up|down}.weight`. The model holds them fused as
/// nn::FusedExperts' [E, ...] parameters; the family's conversion, SequentialExperts and the quantized
/// experts read these names instead of assuming Qwen's.
struct TORCHPATCH_API ExpertsLayout {
  std::string block = "mlp";  ///< the sparse block's name in a layer ("block_sparse_moe": Mixtral)
  std::string gate = "gate_proj";  ///< Mixtral: "w1"
  std::string up = "up_proj";      ///< Mixtral: "w3"
  std::string down = "down_proj";  ///< Mixtral: "w2"
  /// The shared expert's name in the block ("shared_experts": GLM-4.5, DeepSeek-V3) and whether a
  /// sigmoid gate [1, H] scales it (Qwen2-MoE's `shared_expert_gate`).
  std::string shared = "shared_expert";
  bool shared_gate = true;
  std::string router = "gate";  ///< the router's name in the block ("router": GPT-OSS)
};

/// A decoder family's class names: its patch-point keys and its model classes.
struct TORCHPATCH_API DecoderSpec {
  std::string attention;      ///< e.g. "LlamaAttention"
  std::string mlp;            ///< e.g. "LlamaMLP"
  std::string norm;           ///< e.g. "LlamaRMSNorm" (every norm of the layers and the final one)
  std::string decoder_layer;  ///< e.g. "LlamaDecoderLayer"
  std::string base_model;     ///< e.g. "LlamaModel"
  std::string causal_lm;      ///< e.g. "LlamaForCausalLM"
  // MoE families: the block of sparse layers (config.moe.is_sparse_layer) and its parts.
  std::string sparse_block = {};   ///< e.g. "Qwen2MoeSparseMoeBlock"
  std::string router = {};         ///< e.g. "Qwen2MoeTopKRouter"
  std::string experts = {};        ///< e.g. "Qwen2MoeExperts"
  std::string shared_expert = {};  ///< e.g. "Qwen2MoeMLP"; "" = none (Qwen3-MoE)
  ExpertsLayout experts_layout = {};
};

}  // namespace torchpatch
