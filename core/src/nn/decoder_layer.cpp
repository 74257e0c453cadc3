#include "torchpatch/nn/decoder_layer.h"

#include "torchpatch/models/config.h"
#include "torchpatch/patching/build.h"
#include "torchpatch/patching/outputs.h"

namespace torchpatch::nn {

PreNormDecoderLayer::PreNormDecoderLayer(const BuildContext& ctx, const DecoderLayerKeys& keys) {
  auto child = [&](const char* name) { return BuildContext{ctx.config, ctx.layer_idx, ctx.path + "." + name}; };
  self_attn = register_module("self_attn", build<roles::Attention>(keys.attention, child("self_attn")));
  const bool sparse = !keys.sparse_block.empty() && ctx.config.decoder.moe.is_sparse_layer(ctx.layer_idx);
  mlp = register_module("mlp", build<roles::Mlp>(sparse ? keys.sparse_block : keys.mlp, child("mlp")));
  input_layernorm = register_module("input_layernorm", build<roles::Norm>(keys.norm, child("input_layernorm")));
  post_attention_layernorm = register_module(
      "post_attention_layernorm", build<roles::Norm>(keys.norm, child("post_attention_layernorm")));
}

at::Tensor PreNormDecoderLayer::forward(const at::Tensor& hidden, const AttentionInputs& inputs) {
  at::Tensor attention;
  if (!capturing_outputs()) {
    attention = self_attn->forward(input_layernorm->forward(hidden), inputs);
  } else {
    // Capture is on: ask for the attention probabilities too, reported as output 1 (Hugging Face's
    // (attn_output, attn_weights)); they stay undefined for an attention class that does not set them.
    at::Tensor weights;
    AttentionInputs with_weights = inputs;
    with_weights.weights_out = &weights;
    attention = self_attn->forward(input_layernorm->forward(hidden), with_weights);
    report_outputs(*self_attn, {attention, weights});
  }
  auto h = hidden + attention;
  auto out = h + mlp->forward(post_attention_layernorm->forward(h));
  report_outputs(*this, {out});
  return out;
}

}  // namespace torchpatch::nn
