// fused-qkv-attention: one qkv_proj instead of q_proj, k_proj and v_proj, for the decoder attention
// classes. Split sizes are {nH*hd, nKV*hd, nKV*hd}, so grouped-query attention (fewer key/value heads
// than query heads) works. Ships the weight conversion that concatenates q/k/v on load and splits
// them back on save, so checkpoints stay in the hub layout.
#include <ATen/ATen.h>

#include "torchpatch/models/blocks.h"
#include "torchpatch/plugin_api.h"

namespace {

using torchpatch::BuildContext;
using torchpatch::ModelConfig;

std::vector<int64_t> qkv_sizes(const torchpatch::Config& config) {
  return torchpatch::FusedQkvAttention::split_sizes(config.as<ModelConfig>().decoder);
}

// The shared fused block (models/blocks.h), under its own name, with the options of the family's
// attention (its biases; Gemma2's query scale and soft cap).
class FusedQKVAttention : public torchpatch::FusedQkvAttention {
 public:
  explicit FusedQKVAttention(const BuildContext& ctx)
      : torchpatch::FusedQkvAttention(torchpatch::family_attention_options(torchpatch::model_config(ctx))) {}
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
  // Every family's plain grouped-query attention (the `attention` kind), whatever it is called.
  registrar.add_replacement<FusedQKVAttention>("FusedQKVAttention",
                                               {torchpatch::PatchMapping::kind_key(torchpatch::block_kind::kAttention)},
                                               {c10::kCPU, c10::kCUDA});
  registrar.add_conversion("FusedQKVAttention", fused_qkv_rules);
}

}  // namespace

TORCHPATCH_PLUGIN("fused-qkv-attention", "1.0.0", register_plugin)
