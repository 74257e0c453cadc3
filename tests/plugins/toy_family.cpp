// Test plugin "toy_family": a whole model family from a plugin, model_type "toy", on the core's
// decoder blocks: what a newcomer writes to add a family without touching torchpatch.
#include "torchpatch/models/decoder_family.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/nn/rms_norm.h"
#include "torchpatch/plugin_api.h"

namespace {

using namespace torchpatch;

const DecoderSpec& spec() {
  static const DecoderSpec spec{"ToyAttention", "ToyMLP", "ToyRMSNorm", "ToyDecoderLayer", "ToyModel", "ToyForCausalLM"};
  return spec;
}

class ToyAttention : public nn::GqaAttention {
 public:
  explicit ToyAttention(const BuildContext& ctx) : GqaAttention(attention_options(model_config(ctx).decoder)) {}
};
class ToyMLP : public nn::GatedMlp {
 public:
  explicit ToyMLP(const BuildContext& ctx) : GatedMlp(mlp_options(ctx)) {}
};
class ToyRMSNorm : public nn::RmsNorm {
 public:
  explicit ToyRMSNorm(const BuildContext& ctx)
      : RmsNorm(model_config(ctx).decoder.hidden_size, model_config(ctx).decoder.rms_norm_eps) {}
};
class ToyDecoderLayer : public PreNormDecoderLayer {
 public:
  explicit ToyDecoderLayer(const BuildContext& ctx) : PreNormDecoderLayer(ctx, spec()) {}
};
class ToyModel : public DecoderModel {
 public:
  explicit ToyModel(const BuildContext& ctx) : DecoderModel(ctx, spec()) {}
};
class ToyForCausalLM : public DecoderForCausalLM {
 public:
  explicit ToyForCausalLM(const BuildContext& ctx) : DecoderForCausalLM(ctx, spec()) {}
};

void register_plugin(Registrar& registrar) {
  DecoderTraits traits;
  traits.defaults.num_key_value_heads = 0;
  auto family =
      decoder_family<ToyAttention, ToyMLP, ToyRMSNorm, ToyDecoderLayer, ToyModel, ToyForCausalLM>("toy", spec(), traits);
  family.presets = {{"tiny-toy", tiny_decoder_preset("toy", "ToyForCausalLM")}};
  registrar.add_family(std::move(family));
}

}  // namespace

TORCHPATCH_PLUGIN("torchpatch-test-toy-family", "0.1.0", register_plugin)
