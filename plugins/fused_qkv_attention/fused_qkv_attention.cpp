// fused-qkv-attention: one qkv_proj instead of q_proj, k_proj and v_proj, for the decoder attention
// classes. Split sizes are {nH*hd, nKV*hd, nKV*hd}, so grouped-query attention (fewer key/value heads
// than query heads) works. Ships the weight conversion that concatenates q/k/v on load and splits
// them back on save, so checkpoints stay in the hub layout.
#include <ATen/ATen.h>

#include "torchpatch/models/blocks.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/plugin_api.h"

namespace {

using torchpatch::BuildContext;
using torchpatch::ModelConfig;

std::vector<int64_t> qkv_sizes(const torchpatch::Config& config) {
  const auto& d = config.as<ModelConfig>().decoder;
  return {d.num_attention_heads * d.head_dim, d.num_key_value_heads * d.head_dim, d.num_key_value_heads * d.head_dim};
}

class FusedQKVAttention : public torchpatch::roles::Attention {
 public:
  explicit FusedQKVAttention(const BuildContext& ctx)
      : sizes_(qkv_sizes(ctx.config)) {
    const auto& d = torchpatch::model_config(ctx).decoder;
    shape_ = {d.num_attention_heads, d.num_key_value_heads, d.head_dim, 1.0 / std::sqrt(static_cast<double>(d.head_dim))};
    using torchpatch::nn::Linear;
    qkv_proj = register_module("qkv_proj", std::make_shared<Linear>(d.hidden_size, sizes_[0] + sizes_[1] + sizes_[2],
                                                                    d.qkv_bias));
    o_proj = register_module("o_proj", std::make_shared<Linear>(sizes_[0], d.hidden_size, d.o_bias));
  }

  std::shared_ptr<torchpatch::nn::Linear> qkv_proj, o_proj;

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const torchpatch::AttentionInputs& inputs) override {
    const auto qkv = qkv_proj->forward(hidden).split_with_sizes(sizes_, -1);  // one matmul instead of three
    return o_proj->forward(torchpatch::nn::grouped_query_attention(qkv[0], qkv[1], qkv[2], inputs, shape_));
  }

 private:
  std::vector<int64_t> sizes_;
  torchpatch::nn::GqaShape shape_;
};

torchpatch::checkpoint::ConversionRules fused_qkv_rules(const torchpatch::Config& config) {
  using namespace torchpatch::checkpoint;
  ConversionRules rules{WeightConverter{{"q_proj.weight", "k_proj.weight", "v_proj.weight"},
                                        {"qkv_proj.weight"},
                                        {Concatenate(0, qkv_sizes(config))}}};
  if (config.as<ModelConfig>().decoder.qkv_bias) {
    rules.push_back(WeightConverter{{"q_proj.bias", "k_proj.bias", "v_proj.bias"}, {"qkv_proj.bias"},
                                    {Concatenate(0, qkv_sizes(config))}});
  }
  return rules;
}

void register_plugin(torchpatch::Registrar& registrar) {
  registrar.add_replacement<FusedQKVAttention>("FusedQKVAttention", {"LlamaAttention", "MistralAttention", "Qwen2Attention", "GemmaAttention"});
  registrar.add_conversion("FusedQKVAttention", fused_qkv_rules);
}

}  // namespace

TORCHPATCH_PLUGIN("fused-qkv-attention", "1.0.0", register_plugin)
