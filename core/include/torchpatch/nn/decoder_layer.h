// A pre-norm decoder layer: attention and MLP, each behind an RMSNorm and a residual connection.
#pragma once

#include "torchpatch/export.h"

#include <memory>
#include <string>

#include "torchpatch/patching/roles.h"

namespace torchpatch::nn {

/// Patch-point keys of a layer's parts, e.g. {"LlamaAttention", "LlamaMLP", "LlamaRMSNorm"}.
struct TORCHPATCH_API DecoderLayerKeys {
  std::string attention;
  std::string mlp;
  std::string norm;
  std::string sparse_block = {};  ///< MoE families: the block of sparse layers (config.moe.is_sparse_layer)
};

class TORCHPATCH_API PreNormDecoderLayer : public roles::DecoderLayer {
 public:
  PreNormDecoderLayer(const BuildContext& ctx, const DecoderLayerKeys& keys);

  at::Tensor forward(const at::Tensor& hidden, const AttentionInputs& inputs) override;

  std::shared_ptr<roles::Attention> self_attn;
  std::shared_ptr<roles::Mlp> mlp;
  std::shared_ptr<roles::Norm> input_layernorm;
  std::shared_ptr<roles::Norm> post_attention_layernorm;
};

}  // namespace torchpatch::nn
