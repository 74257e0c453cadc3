#include "torchpatch/models/decoder.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/nn/masks.h"
#include "torchpatch/patching/build.h"

namespace torchpatch {

namespace {
std::string join_path(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}
}  // namespace

void validate_decoder_inputs(const ModelInputs& in, int64_t vocab_size) {
  const auto& ids = in.input_ids;
  if (!ids.defined()) throw InputError("input_ids: required");
  if (ids.dim() != 2) throw InputError(fmt::format("input_ids: expected [batch, seq] (2 dims), got {} dims", ids.dim()));
  if (ids.scalar_type() != at::kLong && ids.scalar_type() != at::kInt) {
    throw InputError(fmt::format("input_ids: expected an integer tensor, got {}", c10::toString(ids.scalar_type())));
  }
  if (ids.size(0) == 0 || ids.size(1) == 0) throw InputError("input_ids: empty batch or sequence");
  const auto bad = ((ids < 0).logical_or(ids >= vocab_size)).nonzero();
  if (bad.size(0) > 0) {
    const auto b = bad[0][0].item<int64_t>(), t = bad[0][1].item<int64_t>();
    throw InputError(fmt::format("input_ids: token id {} at [{}, {}] is out of range for vocab_size {}",
                                 ids[b][t].item<int64_t>(), b, t, vocab_size));
  }
  for (const auto& [name, tensor] : {std::pair<const char*, const at::Tensor&>{"attention_mask", in.attention_mask},
                                     std::pair<const char*, const at::Tensor&>{"position_ids", in.position_ids}}) {
    if (!tensor.defined()) continue;
    if (tensor.sizes() != ids.sizes()) {
      throw InputError(fmt::format("{}: shape {} does not match input_ids {}", name, fmt::join(tensor.sizes(), "x"),
                                   fmt::join(ids.sizes(), "x")));
    }
  }
  if (in.position_ids.defined() && (in.position_ids < 0).any().item<bool>()) {
    throw InputError("position_ids: negative position");
  }
}

DecoderModel::DecoderModel(const ModelConfig& config, const DecoderFamily& family, const std::string& prefix)
    : PretrainedModel(config, family.base_model), rotary_emb(config.decoder) {
  const auto& d = this->config().decoder;
  embed_tokens = register_module("embed_tokens", std::make_shared<nn::Embedding>(d.vocab_size, d.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < d.num_hidden_layers; ++i) {
    BuildContext ctx{this->config(), i, join_path(prefix, fmt::format("layers.{}", i))};
    auto layer = build<roles::DecoderLayer>(family.decoder_layer, ctx);
    layers->push_back(layer);
    layer_list_.push_back(layer);
  }
  norm = register_module("norm", build<roles::Norm>(family.norm, BuildContext{this->config(), -1, join_path(prefix, "norm")}));
}

ModelOutput DecoderModel::forward(const ModelInputs& in) {
  const auto& d = config().decoder;
  validate_decoder_inputs(in, d.vocab_size);
  const int64_t batch = in.input_ids.size(0), len = in.input_ids.size(1);

  auto h = embed_tokens->forward(in.input_ids.to(at::kLong));  // [B, T, H]
  auto position_ids = in.position_ids.defined() ? in.position_ids.to(at::kLong)
                                                : at::arange(len, at::kLong).unsqueeze(0).expand({batch, len});
  AttentionInputs attn;
  std::tie(attn.cos, attn.sin) = rotary_emb.forward(position_ids, h.scalar_type());
  attn.mask = nn::causal_mask(in.attention_mask, batch, len, /*past_len=*/0, h.scalar_type());
  attn.position_ids = position_ids;

  ModelOutput out;
  if (in.output_hidden_states) out.hidden_states.push_back(h);
  for (size_t i = 0; i < layer_list_.size(); ++i) {
    h = layer_list_[i]->forward(h, attn);
    // Hugging Face convention: the last layer's output is replaced by the normed one.
    if (in.output_hidden_states && i + 1 < layer_list_.size()) out.hidden_states.push_back(h);
  }
  out.last_hidden_state = norm->forward(h);
  if (in.output_hidden_states) out.hidden_states.push_back(out.last_hidden_state);
  return out;
}

LmHead::LmHead(int64_t hidden_size, int64_t vocab_size) {
  weight = register_parameter("weight", at::empty({vocab_size, hidden_size}));
  if (!nn::SkipInit::active()) nn::init_parameter(weight, /*is_bias=*/false, /*is_norm=*/false);
}

LmHead::LmHead(const at::Tensor& tied_weight) { weight = register_parameter("weight", tied_weight); }

at::Tensor LmHead::forward(const at::Tensor& hidden) const { return at::linear(hidden, weight); }

DecoderForCausalLM::DecoderForCausalLM(const ModelConfig& config, const DecoderFamily& family)
    : PretrainedModel(config, family.causal_lm) {
  const auto& d = this->config().decoder;
  model = register_module("model", std::make_shared<DecoderModel>(this->config(), family, "model"));
  lm_head = register_module("lm_head", d.tie_word_embeddings ? std::make_shared<LmHead>(model->embed_tokens->weight)
                                                              : std::make_shared<LmHead>(d.hidden_size, d.vocab_size));
}

ModelOutput DecoderForCausalLM::forward(const ModelInputs& in) {
  auto out = model->forward(in);
  out.logits = lm_head->forward(out.last_hidden_state);
  return out;
}

std::map<std::string, std::string> DecoderForCausalLM::tied_weights() const {
  if (!config().decoder.tie_word_embeddings) return {};
  return {{"lm_head.weight", "model.embed_tokens.weight"}};
}

}  // namespace torchpatch
