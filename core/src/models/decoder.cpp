#include "torchpatch/models/decoder.h"

#include <algorithm>
#include <optional>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/generation/cache.h"
#include "torchpatch/nn/losses.h"
#include "torchpatch/nn/masks.h"
#include "torchpatch/patching/outputs.h"
#include "torchpatch/patching/build.h"

namespace torchpatch {

namespace {
std::string join_path(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// The class behind a layer's self-attention, for messages ("the layer" when it has none by that name).
std::string attention_class(const roles::DecoderLayer& layer) {
  for (const auto& child : layer.named_children()) {
    if (child.key() != "self_attn") continue;
    if (const auto* attention = dynamic_cast<const PatchableModule*>(child.value().get())) {
      return attention->patch_record().class_name;
    }
  }
  return layer.patch_record().class_name;
}

const std::string& layer_type(const DecoderConfig& config, int64_t i) {
  static const std::string full = kFullAttention;
  return i < static_cast<int64_t>(config.layer_types.size()) ? config.layer_types[i] : full;
}
}  // namespace

void validate_decoder_inputs(const ModelInputs& in, int64_t vocab_size, int64_t past_len) {
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
  const std::vector<int64_t> mask_shape{ids.size(0), past_len + ids.size(1)};
  if (in.attention_mask.defined() && in.attention_mask.sizes() != at::IntArrayRef(mask_shape)) {
    throw InputError(past_len == 0 ? fmt::format("attention_mask: shape {} does not match input_ids {}",
                                                 fmt::join(in.attention_mask.sizes(), "x"), fmt::join(ids.sizes(), "x"))
                                   : fmt::format("attention_mask: shape {} does not match {} ({} cached + {} new "
                                                 "tokens per row)",
                                                 fmt::join(in.attention_mask.sizes(), "x"), fmt::join(mask_shape, "x"),
                                                 past_len, ids.size(1)));
  }
  if (in.position_ids.defined()) {
    if (in.position_ids.sizes() != ids.sizes()) {
      throw InputError(fmt::format("position_ids: shape {} does not match input_ids {}",
                                   fmt::join(in.position_ids.sizes(), "x"), fmt::join(ids.sizes(), "x")));
    }
    if ((in.position_ids < 0).any().item<bool>()) throw InputError("position_ids: negative position");
  }
}

void check_positions(const at::Tensor& position_ids, const DecoderConfig& config) {
  const int64_t longest = position_ids.max().item<int64_t>() + 1;
  if (longest > config.max_positions()) {
    throw InputError(fmt::format(
        "sequence of {} positions is longer than the model supports ({}: max_position_embeddings {}{})", longest,
        config.max_positions(), config.max_position_embeddings,
        config.rope.rope_type == "linear" || config.rope.rope_type == "dynamic"
            ? fmt::format(" x rope factor {}", config.rope.factor)
            : std::string(", and rope_type '" + config.rope.rope_type + "' does not stretch it")));
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
  if (!in.outputs.empty()) return forward_capturing(in);
  const auto& d = config().decoder;
  auto cache = in.past_key_values;
  if (!cache && in.use_cache) cache = std::make_shared<DynamicCache>(d);
  const int64_t past = cache ? cache->get_seq_length() : 0;
  validate_decoder_inputs(in, d.vocab_size, past);
  const int64_t batch = in.input_ids.size(0), len = in.input_ids.size(1);

  auto h = embed_tokens->forward(in.input_ids.to(at::kLong));  // [B, T, H]
  auto position_ids = in.position_ids.defined() ? in.position_ids.to(at::kLong)
                                                : at::arange(past, past + len, at::kLong).unsqueeze(0).expand({batch, len});
  check_positions(position_ids, d);
  AttentionInputs attn;
  std::tie(attn.cos, attn.sin) = rotary_emb.forward(position_ids, h.scalar_type());
  attn.position_ids = position_ids;
  attn.cache = cache.get();

  // One mask per kind of layer; a sliding layer's cache spans fewer keys than a full one's.
  std::map<std::string, at::Tensor> masks;
  for (int64_t i = 0; i < static_cast<int64_t>(layer_list_.size()); ++i) {
    const auto& type = layer_type(d, i);
    if (masks.count(type)) continue;
    const MaskSizes kv = cache ? cache->get_mask_sizes(len, i) : MaskSizes{len, 0};
    const auto window = type == kSlidingAttention ? d.sliding_window : std::nullopt;
    masks[type] = nn::attention_mask(in.attention_mask, nn::MaskLayout{batch, len, past, kv, window}, h.scalar_type());
  }

  ModelOutput out;
  out.past_key_values = cache;
  if (in.output_hidden_states) out.hidden_states.push_back(h);
  for (size_t i = 0; i < layer_list_.size(); ++i) {
    attn.layer_idx = static_cast<int64_t>(i);
    attn.mask = masks.at(layer_type(d, attn.layer_idx));
    h = layer_list_[i]->forward(h, attn);
    if (cache && cache->get_seq_length(attn.layer_idx) != past + len) {
      // An attention class that does not append to the cache would make every later step forget.
      throw PatchError(fmt::format("layer {}: {} did not update the key/value cache (it holds {} tokens, expected {}); "
                                   "attention classes must append through inputs.cache, as "
                                   "nn::grouped_query_attention does",
                                   i, attention_class(*layer_list_[i]), cache->get_seq_length(attn.layer_idx),
                                   past + len));
    }
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

at::Tensor LmHead::forward(const at::Tensor& hidden) const { return nn::linear(hidden, weight); }

DecoderForCausalLM::DecoderForCausalLM(const ModelConfig& config, const DecoderFamily& family)
    : PretrainedModel(config, family.causal_lm) {
  const auto& d = this->config().decoder;
  model = register_module("model", std::make_shared<DecoderModel>(this->config(), family, "model"));
  lm_head = register_module("lm_head", d.tie_word_embeddings ? std::make_shared<LmHead>(model->embed_tokens->weight)
                                                              : std::make_shared<LmHead>(d.hidden_size, d.vocab_size));
}

ModelOutput DecoderForCausalLM::forward(const ModelInputs& in) {
  if (in.logits_to_keep < 0) throw InputError(fmt::format("logits_to_keep: must be >= 0, got {}", in.logits_to_keep));
  const auto& moe = config().decoder.moe;
  const bool aux = in.output_router_logits && moe.num_experts > 0;
  auto names = in.outputs;
  if (aux && std::find(names.begin(), names.end(), "router_logits") == names.end()) names.push_back("router_logits");
  std::optional<CaptureOutputs> capture;  // recorders are looked up by this class, the outer one
  if (!names.empty()) capture.emplace(class_name(), names);
  ModelInputs inner = in;
  inner.outputs.clear();
  auto out = model->forward(inner);
  if (capture) out.captured = capture->take();
  if (aux) {
    out.aux_loss = nn::load_balancing_loss(out.captured.at("router_logits"), moe.num_experts, moe.num_experts_per_tok,
                                           in.attention_mask);
  }
  const int64_t len = out.last_hidden_state.size(1);
  const int64_t keep = in.logits_to_keep == 0 ? len : std::min(in.logits_to_keep, len);
  out.logits = lm_head->forward(out.last_hidden_state.narrow(1, len - keep, keep));
  if (in.labels.defined()) {
    if (keep != len) throw InputError("labels: need logits for every position (logits_to_keep 0)");
    out.loss = nn::causal_lm_loss(out.logits, in.labels);
    if (out.aux_loss.defined()) out.loss = out.loss + moe.router_aux_loss_coef * out.aux_loss;
  }
  return out;
}

std::map<std::string, std::string> DecoderForCausalLM::tied_weights() const {
  if (!config().decoder.tie_word_embeddings) return {};
  return {{"lm_head.weight", "model.embed_tokens.weight"}};
}

}  // namespace torchpatch
