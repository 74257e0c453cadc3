#include "torchpatch/models/decoder.h"

#include <algorithm>
#include <optional>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/error.h"
#include "torchpatch/generation/cache.h"
#include "torchpatch/nn/losses.h"
#include "torchpatch/nn/masks.h"
#include "torchpatch/patching/build.h"

namespace torchpatch {

namespace {
const std::string& layer_type(const DecoderConfig& config, int64_t i) {
  static const std::string full = kFullAttention;
  return i < static_cast<int64_t>(config.layer_types.size()) ? config.layer_types[i] : full;
}

thread_local int device_made_inputs = 0;
}  // namespace

DeviceMadeInputs::DeviceMadeInputs() { ++device_made_inputs; }
DeviceMadeInputs::~DeviceMadeInputs() { --device_made_inputs; }
bool DeviceMadeInputs::active() { return device_made_inputs > 0; }

void validate_decoder_inputs(const ModelInputs& in, int64_t vocab_size, int64_t past_len) {
  const bool read_values = !DeviceMadeInputs::active();
  const auto& ids = in.input_ids;
  if (!ids.defined()) throw InputError("input_ids: required");
  if (ids.dim() != 2) throw InputError(fmt::format("input_ids: expected [batch, seq] (2 dims), got {} dims", ids.dim()));
  if (ids.scalar_type() != at::kLong && ids.scalar_type() != at::kInt) {
    throw InputError(fmt::format("input_ids: expected an integer tensor, got {}", c10::toString(ids.scalar_type())));
  }
  if (ids.size(0) == 0 || ids.size(1) == 0) throw InputError("input_ids: empty batch or sequence");
  if (read_values) {
    const auto bad = ((ids < 0).logical_or(ids >= vocab_size)).nonzero();
    if (bad.size(0) > 0) {
      const auto b = bad[0][0].item<int64_t>(), t = bad[0][1].item<int64_t>();
      throw InputError(fmt::format("input_ids: token id {} at [{}, {}] is out of range for vocab_size {}",
                                   ids[b][t].item<int64_t>(), b, t, vocab_size));
    }
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
    if (read_values && (in.position_ids < 0).any().item<bool>()) throw InputError("position_ids: negative position");
  }
}

void check_positions(const at::Tensor& position_ids, const DecoderConfig& config, bool rotary) {
  if (DeviceMadeInputs::active()) return;
  const int64_t longest = position_ids.max().item<int64_t>() + 1;
  const int64_t limit = rotary ? config.max_positions() : config.max_position_embeddings;
  if (longest > limit) {
    throw InputError(fmt::format("sequence of {} positions is longer than the model supports ({})", longest,
                                 config.position_limit(rotary)));
  }
}

DecoderModel::DecoderModel(const BuildContext& ctx, const DecoderSpec& spec)
    : PretrainedModel(model_config(ctx), spec.base_model), rotary_emb(model_config(ctx).decoder) {
  const auto& d = config().decoder;
  const BuildContext self{config(), -1, ctx.path};
  embed_tokens = register_module("embed_tokens", std::make_shared<nn::Embedding>(d.vocab_size, d.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < d.num_hidden_layers; ++i) {
    auto layer_ctx = self.child(fmt::format("layers.{}", i));
    layer_ctx.layer_idx = i;
    auto layer = build<roles::DecoderLayer>(spec.decoder_layer, layer_ctx);
    layers->push_back(layer);
    layer_list_.push_back(layer);
  }
  norm = register_module("norm", build<roles::Norm>(spec.norm, self.child("norm")));
  if (d.sliding_rope) sliding_rotary_emb.emplace(nn::RopeOptions{*d.sliding_rope, d.head_dim, d.max_position_embeddings});
}

at::Tensor DecoderModel::embed(const at::Tensor& ids) { return embed_tokens->forward(ids); }

ModelOutput DecoderModel::forward_impl(const ModelInputs& in) {
  const auto& d = config().decoder;
  auto cache = in.past_key_values;
  if (!cache && in.use_cache) cache = std::make_shared<DynamicCache>(d);
  const int64_t past = cache ? cache->get_seq_length() : 0;
  validate_decoder_inputs(in, d.vocab_size, past);
  const int64_t batch = in.input_ids.size(0), len = in.input_ids.size(1);

  auto h = embed(in.input_ids.to(at::kLong));  // [B, T, H]
  auto position_ids = in.position_ids.defined() ? in.position_ids.to(at::kLong)
                                                : at::arange(past, past + len, h.options().dtype(at::kLong))
                                                      .unsqueeze(0)
                                                      .expand({batch, len});
  check_positions(position_ids, d);
  AttentionInputs attn;
  std::tie(attn.cos, attn.sin) = rotary_emb.forward(position_ids, h.scalar_type());
  std::pair<at::Tensor, at::Tensor> sliding_tables{attn.cos, attn.sin};
  if (sliding_rotary_emb) sliding_tables = sliding_rotary_emb->forward(position_ids, h.scalar_type());
  const std::pair<at::Tensor, at::Tensor> full_tables{attn.cos, attn.sin};
  attn.position_ids = position_ids;
  attn.cache = cache.get();

  // One mask per kind of layer; a sliding layer's cache spans fewer keys than a full one's.
  std::map<std::string, at::Tensor> masks;
  for (int64_t i = 0; i < static_cast<int64_t>(layer_list_.size()); ++i) {
    const auto& type = layer_type(d, i);
    if (masks.count(type)) continue;
    const MaskSizes kv = cache ? cache->get_mask_sizes(len, i) : MaskSizes{len, 0};
    const auto window = type == kSlidingAttention ? d.sliding_window : std::nullopt;
    masks[type] = nn::attention_mask(in.attention_mask, nn::MaskLayout{batch, len, past, kv, window}, h.options());
  }

  ModelOutput out;
  out.past_key_values = cache;
  if (in.output_hidden_states) out.hidden_states.push_back(h);
  for (size_t i = 0; i < layer_list_.size(); ++i) {
    attn.layer_idx = static_cast<int64_t>(i);
    const auto& type = layer_type(d, attn.layer_idx);
    attn.mask = masks.at(type);
    std::tie(attn.cos, attn.sin) = type == kSlidingAttention ? sliding_tables : full_tables;
    h = layer_list_[i]->forward(h, attn);
    // Hugging Face convention: the last layer's output is replaced by the normed one.
    if (in.output_hidden_states && i + 1 < layer_list_.size()) out.hidden_states.push_back(h);
  }
  out.last_hidden_state = norm->forward(h);
  if (in.output_hidden_states) out.hidden_states.push_back(out.last_hidden_state);
  return out;
}

DecoderForCausalLM::DecoderForCausalLM(const BuildContext& ctx, const DecoderSpec& spec)
    : PretrainedModel(model_config(ctx), spec.causal_lm) {
  const auto& d = config().decoder;
  const BuildContext self{config(), -1, ctx.path};
  model = register_module("model", build<DecoderModel>(spec.base_model, self.child("model")));
  lm_head = register_module("lm_head", d.tie_word_embeddings
                                          ? std::shared_ptr<roles::Linear>(std::make_shared<TiedLmHead>(model->embed_tokens->weight))
                                          : nn::make_linear("lm_head", d.hidden_size, d.vocab_size, false));
}

void DecoderForCausalLM::required_outputs(const ModelInputs& in, std::vector<std::string>& names) const {
  const bool aux = in.output_router_logits && config().decoder.moe.num_experts > 0;
  if (aux && std::find(names.begin(), names.end(), "router_logits") == names.end()) names.push_back("router_logits");
}

at::Tensor DecoderForCausalLM::logits(const at::Tensor& hidden) { return lm_head->forward(hidden); }

ModelOutput DecoderForCausalLM::forward_impl(const ModelInputs& in) {
  if (in.logits_to_keep < 0) throw InputError(fmt::format("logits_to_keep: must be >= 0, got {}", in.logits_to_keep));
  auto out = model->forward(in);
  const int64_t len = out.last_hidden_state.size(1);
  const int64_t keep = in.logits_to_keep == 0 ? len : std::min(in.logits_to_keep, len);
  out.logits = logits(out.last_hidden_state.narrow(1, len - keep, keep));
  if (in.labels.defined() && keep != len) throw InputError("labels: need logits for every position (logits_to_keep 0)");
  return out;
}

void DecoderForCausalLM::complete(const ModelInputs& in, ModelOutput& out) const {
  const auto& moe = config().decoder.moe;
  if (in.output_router_logits && moe.num_experts > 0) {
    out.aux_loss = nn::load_balancing_loss(out.captured.at("router_logits"), moe.num_experts, moe.num_experts_per_tok,
                                           in.attention_mask);
  }
  if (in.labels.defined()) {
    out.loss = nn::causal_lm_loss(out.logits, in.labels);
    if (out.aux_loss.defined()) out.loss = out.loss + moe.router_aux_loss_coef * out.aux_loss;
  }
}

std::map<std::string, std::string> DecoderForCausalLM::tied_weights() const {
  if (!config().decoder.tie_word_embeddings) return {};
  return {{"lm_head.weight", "model.embed_tokens.weight"}};
}

}  // namespace torchpatch
