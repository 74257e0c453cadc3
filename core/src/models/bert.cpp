// BERT: Hugging Face's BertModel and BertForMaskedLM, every block built through a patch point.
#include "torchpatch/models/bert.h"

#include <cmath>
#include <optional>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/error.h"
#include "torchpatch/models/decoder.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/losses.h"
#include "torchpatch/nn/masks.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/patching/build.h"
#include "torchpatch/patching/outputs.h"
#include "torchpatch/models/blocks.h"

namespace torchpatch {

namespace roles {
BertEmbeddings::~BertEmbeddings() = default;
BertSelfAttention::~BertSelfAttention() = default;
BertCrossAttention::~BertCrossAttention() = default;
BertSelfOutput::~BertSelfOutput() = default;
BertAttention::~BertAttention() = default;
BertIntermediate::~BertIntermediate() = default;
BertOutput::~BertOutput() = default;
BertLayer::~BertLayer() = default;
BertEncoder::~BertEncoder() = default;
BertPooler::~BertPooler() = default;
BertModel::~BertModel() = default;
BertForMaskedLM::~BertForMaskedLM() = default;
}  // namespace roles

namespace bert {

namespace {

std::shared_ptr<nn::LayerNorm> layer_norm(const ModelConfig& config) {
  return std::make_shared<nn::LayerNorm>(config.decoder.hidden_size, config.bert().layer_norm_eps);
}

// Multi-head attention of queries from `x` [B, Q, H] over keys/values from `source` [B, S, H]:
// eager, scaled by hd^-0.5, additive mask, softmax in the input dtype (as BERT does) -> [B, Q, H].
at::Tensor attend(roles::Linear& query, roles::Linear& key, roles::Linear& value, int64_t heads,
                  const at::Tensor& x, const at::Tensor& source, const at::Tensor& mask, at::Tensor* weights_out) {
  const int64_t b = x.size(0), q_len = x.size(1), kv_len = source.size(1);
  auto q = query.forward(x);
  const int64_t width = q.size(-1), hd = width / heads;
  q = q.view({b, q_len, heads, hd}).transpose(1, 2);                             // [B, nH, Q, hd]
  auto k = key.forward(source).view({b, kv_len, heads, hd}).transpose(1, 2);    // [B, nH, S, hd]
  auto v = value.forward(source).view({b, kv_len, heads, hd}).transpose(1, 2);  // [B, nH, S, hd]
  auto out = nn::eager_attention(q, k, v, mask, 1.0 / std::sqrt(static_cast<double>(hd)), weights_out,
                                 /*upcast_softmax=*/false);
  return out.reshape({b, q_len, width});
}

int64_t checked_heads(const ModelConfig& config) {
  const auto& d = config.decoder;
  if (d.hidden_size % d.num_attention_heads != 0) {
    throw ConfigError(fmt::format("BERT: hidden_size {} is not divisible by num_attention_heads {}", d.hidden_size,
                                  d.num_attention_heads));
  }
  return d.num_attention_heads;
}

// token_type_ids checked against input_ids and the number of segment types; zeros when not given.
at::Tensor token_types(const ModelInputs& in, int64_t type_vocab_size) {
  const auto& ids = in.input_ids;
  if (!in.token_type_ids.defined()) return at::zeros(ids.sizes(), ids.options().dtype(at::kLong));
  const auto& types = in.token_type_ids;
  if (types.sizes() != ids.sizes()) {
    throw InputError(fmt::format("token_type_ids: shape {} does not match input_ids {}", fmt::join(types.sizes(), "x"),
                                 fmt::join(ids.sizes(), "x")));
  }
  if (at::isFloatingType(types.scalar_type()) || types.scalar_type() == at::kBool) {
    throw InputError(fmt::format("token_type_ids: expected an integer tensor, got {}", c10::toString(types.scalar_type())));
  }
  const auto bad = (types < 0).logical_or(types >= type_vocab_size).nonzero();
  if (bad.size(0) > 0) {
    const auto b = bad[0][0].item<int64_t>(), t = bad[0][1].item<int64_t>();
    throw InputError(fmt::format("token_type_ids: type {} at [{}, {}] is out of range for type_vocab_size {}",
                                 types[b][t].item<int64_t>(), b, t, type_vocab_size));
  }
  return types.to(at::kLong);
}

// The encoder's padding mask for cross-attention, checked against its states.
at::Tensor encoder_mask(const ModelInputs& in, at::TensorOptions options) {
  const auto& states = in.encoder_hidden_states;
  const auto& mask = in.encoder_attention_mask;
  if (!mask.defined()) return {};
  if (mask.dim() != 2 || mask.size(0) != states.size(0) || mask.size(1) != states.size(1)) {
    throw InputError(fmt::format("encoder_attention_mask: shape {} does not match encoder_hidden_states {} (expected "
                                 "[batch, encoder tokens])",
                                 fmt::join(mask.sizes(), "x"), fmt::join(states.sizes(), "x")));
  }
  return nn::bidirectional_mask(mask, options);
}

}  // namespace

// --- embeddings -----------------------------------------------------------------------------------

BertEmbeddings::BertEmbeddings(const BuildContext& ctx) {
  const auto& d = model_config(ctx).decoder;
  word_embeddings = register_module("word_embeddings", std::make_shared<nn::Embedding>(d.vocab_size, d.hidden_size));
  position_embeddings = register_module(
      "position_embeddings", std::make_shared<nn::Embedding>(d.max_position_embeddings, d.hidden_size));
  token_type_embeddings = register_module(
      "token_type_embeddings", std::make_shared<nn::Embedding>(model_config(ctx).bert().type_vocab_size, d.hidden_size));
  LayerNorm = register_module("LayerNorm", layer_norm(model_config(ctx)));
}

at::Tensor BertEmbeddings::forward(const at::Tensor& input_ids, const at::Tensor& token_type_ids,
                                   const at::Tensor& position_ids) {
  auto h = word_embeddings->forward(input_ids) + token_type_embeddings->forward(token_type_ids);
  h = h + position_embeddings->forward(position_ids);
  return LayerNorm->forward(h);  // [B, T, H]
}

// --- attention ------------------------------------------------------------------------------------

BertSelfAttention::BertSelfAttention(const BuildContext& ctx) : num_heads(checked_heads(model_config(ctx))) {
  const int64_t h = model_config(ctx).decoder.hidden_size;
  query = register_module("query", nn::make_linear("query", h, h, true));
  key = register_module("key", nn::make_linear("key", h, h, true));
  value = register_module("value", nn::make_linear("value", h, h, true));
}

at::Tensor BertSelfAttention::forward(const at::Tensor& hidden, const BertAttentionInputs& in) {
  return attend(*query, *key, *value, num_heads, hidden, hidden, in.mask, in.weights_out);
}

BertCrossAttention::BertCrossAttention(const BuildContext& ctx) : num_heads(checked_heads(model_config(ctx))) {
  const int64_t h = model_config(ctx).decoder.hidden_size;
  query = register_module("query", nn::make_linear("query", h, h, true));
  key = register_module("key", nn::make_linear("key", h, h, true));
  value = register_module("value", nn::make_linear("value", h, h, true));
}

at::Tensor BertCrossAttention::forward(const at::Tensor& hidden, const BertAttentionInputs& in) {
  return attend(*query, *key, *value, num_heads, hidden, in.encoder_hidden_states, in.encoder_mask,
                in.cross_weights_out);
}

BertSelfOutput::BertSelfOutput(const BuildContext& ctx) {
  const int64_t h = model_config(ctx).decoder.hidden_size;
  dense = register_module("dense", nn::make_linear("dense", h, h, true));
  LayerNorm = register_module("LayerNorm", layer_norm(model_config(ctx)));
}

at::Tensor BertSelfOutput::forward(const at::Tensor& hidden, const at::Tensor& input) {
  return LayerNorm->forward(dense->forward(hidden) + input);
}

BertAttention::BertAttention(const BuildContext& ctx) {
  if (ctx.flag("cross_attention", false)) {
    cross_attention = register_module("self", build<roles::BertCrossAttention>("BertCrossAttention", ctx.child("self")));
  } else {
    self_attention = register_module("self", build<roles::BertSelfAttention>("BertSelfAttention", ctx.child("self")));
  }
  output = register_module("output", build<roles::BertSelfOutput>("BertSelfOutput", ctx.child("output")));
}

at::Tensor BertAttention::forward(const at::Tensor& hidden, const BertAttentionInputs& in) {
  at::Tensor attention;
  if (!capturing_outputs()) {
    attention = self_attention ? self_attention->forward(hidden, in) : cross_attention->forward(hidden, in);
  } else {
    // Capture is on: ask for the probabilities too, reported as output 1 (Hugging Face's
    // (attn_output, attn_weights)).
    at::Tensor weights;
    BertAttentionInputs with_weights = in;
    with_weights.weights_out = with_weights.cross_weights_out = &weights;
    const PatchableModule* self = self_attention ? static_cast<const PatchableModule*>(self_attention.get())
                                                 : static_cast<const PatchableModule*>(cross_attention.get());
    attention = self_attention ? self_attention->forward(hidden, with_weights)
                               : cross_attention->forward(hidden, with_weights);
    report_outputs(*self, {attention, weights});
  }
  return output->forward(attention, hidden);
}

// --- feed-forward ---------------------------------------------------------------------------------

BertIntermediate::BertIntermediate(const BuildContext& ctx) : act(model_config(ctx).decoder.activation) {
  const auto& d = model_config(ctx).decoder;
  dense = register_module("dense", nn::make_linear("dense", d.hidden_size, d.intermediate_size, true));
}

at::Tensor BertIntermediate::forward(const at::Tensor& x) { return nn::activate(act, dense->forward(x)); }

BertOutput::BertOutput(const BuildContext& ctx) {
  const auto& d = model_config(ctx).decoder;
  dense = register_module("dense", nn::make_linear("dense", d.intermediate_size, d.hidden_size, true));
  LayerNorm = register_module("LayerNorm", layer_norm(model_config(ctx)));
}

at::Tensor BertOutput::forward(const at::Tensor& hidden, const at::Tensor& input) {
  return LayerNorm->forward(dense->forward(hidden) + input);
}

// --- layers ---------------------------------------------------------------------------------------

BertLayer::BertLayer(const BuildContext& ctx) {
  attention = register_module("attention", build<roles::BertAttention>("BertAttention", ctx.child("attention")));
  if (model_config(ctx).bert().add_cross_attention) {
    const BuildContext cross = ctx.child("crossattention", {{"cross_attention", true}});
    crossattention = register_module("crossattention", build<roles::BertAttention>("BertAttention", cross));
  }
  intermediate = register_module("intermediate",
                                 build<roles::BertIntermediate>("BertIntermediate", ctx.child("intermediate")));
  output = register_module("output", build<roles::BertOutput>("BertOutput", ctx.child("output")));
}

at::Tensor BertLayer::forward(const at::Tensor& hidden, const BertAttentionInputs& in) {
  auto h = attention->forward(hidden, in);
  if (in.encoder_hidden_states.defined()) {
    if (!crossattention) {
      throw InputError(fmt::format("{}: encoder_hidden_states given but the layer has no cross-attention (set "
                                   "is_decoder and add_cross_attention in the config)",
                                   patch_record().path));
    }
    h = crossattention->forward(h, in);
  }
  auto out = output->forward(intermediate->forward(h), h);
  report_outputs(*this, {out});
  return out;
}

BertEncoder::BertEncoder(const BuildContext& ctx) {
  layer = register_module("layer", torch::nn::ModuleList());
  for (int64_t i = 0; i < model_config(ctx).decoder.num_hidden_layers; ++i) {
    BuildContext c = ctx.child(fmt::format("layer.{}", i));
    c.layer_idx = i;
    auto built = build<roles::BertLayer>("BertLayer", c);
    layer->push_back(built);
    layers_.push_back(built);
  }
}

at::Tensor BertEncoder::forward(const at::Tensor& hidden, const BertAttentionInputs& in,
                                std::vector<at::Tensor>* all_hidden) {
  auto h = hidden;
  BertAttentionInputs inputs = in;
  for (size_t i = 0; i < layers_.size(); ++i) {
    inputs.layer_idx = static_cast<int64_t>(i);
    h = layers_[i]->forward(h, inputs);
    if (all_hidden) all_hidden->push_back(h);
  }
  return h;
}

BertPooler::BertPooler(const BuildContext& ctx) {
  const int64_t h = model_config(ctx).decoder.hidden_size;
  dense = register_module("dense", nn::make_linear("dense", h, h, true));
}

at::Tensor BertPooler::forward(const at::Tensor& hidden) {
  return at::tanh(dense->forward(hidden.select(1, 0)));  // the first token ([CLS]) of each row
}

// --- models ---------------------------------------------------------------------------------------

BertModel::BertModel(const BuildContext& ctx) : roles::BertModel(model_config(ctx), "BertModel"), prefix_(ctx.path) {
  const BuildContext self{config(), -1, ctx.path};
  embeddings = register_module("embeddings", build<roles::BertEmbeddings>("BertEmbeddings", self.child("embeddings")));
  encoder = register_module("encoder", build<roles::BertEncoder>("BertEncoder", self.child("encoder")));
  if (ctx.flag("add_pooling_layer", true)) {
    pooler = register_module("pooler", build<roles::BertPooler>("BertPooler", self.child("pooler")));
  }
}

ModelOutput BertModel::forward_impl(const ModelInputs& in) {
  const auto& d = config().decoder;
  const auto& b = config().bert();
  if (in.past_key_values || in.use_cache) {
    throw InputError("past_key_values / use_cache: BERT models run without a key/value cache");
  }
  if (in.labels.defined()) throw InputError("labels: BertModel has no language-model head (use BertForMaskedLM)");
  validate_decoder_inputs(in, d.vocab_size);
  const int64_t batch = in.input_ids.size(0), len = in.input_ids.size(1);
  const auto types = token_types(in, b.type_vocab_size);
  const auto positions = in.position_ids.defined() ? in.position_ids.to(at::kLong)
                                                   : at::arange(len, in.input_ids.options().dtype(at::kLong))
                                                         .unsqueeze(0)
                                                         .expand({batch, len});
  check_positions(positions, d, /*rotary=*/false);

  auto h = embeddings->forward(in.input_ids.to(at::kLong), types, positions);  // [B, T, H]
  const auto options = h.options();
  BertAttentionInputs attn;
  // An encoder sees every real token; a decoder only the ones before it.
  attn.mask = b.is_decoder ? nn::causal_mask(in.attention_mask, batch, len, 0, options)
                           : nn::bidirectional_mask(in.attention_mask, options);
  if (in.encoder_hidden_states.defined()) {
    const auto& states = in.encoder_hidden_states;
    if (!b.add_cross_attention) {
      throw InputError(fmt::format("encoder_hidden_states: {} has no cross-attention (the config needs is_decoder and "
                                   "add_cross_attention)",
                                   class_name()));
    }
    if (states.dim() != 3 || states.size(0) != batch || states.size(2) != d.hidden_size) {
      throw InputError(fmt::format("encoder_hidden_states: expected [{}, tokens, {}], got {}", batch, d.hidden_size,
                                   fmt::join(states.sizes(), "x")));
    }
    attn.encoder_hidden_states = states.to(h.scalar_type());
    attn.encoder_mask = encoder_mask(in, options);
  } else if (in.encoder_attention_mask.defined()) {
    throw InputError("encoder_attention_mask: given without encoder_hidden_states");
  }

  ModelOutput out;
  if (in.output_hidden_states) out.hidden_states.push_back(h);
  out.last_hidden_state = encoder->forward(h, attn, in.output_hidden_states ? &out.hidden_states : nullptr);
  if (pooler) out.pooler_output = pooler->forward(out.last_hidden_state);
  return out;
}

BertLMPredictionHead::BertLMPredictionHead(const ModelConfig& config, const at::Tensor& word_embeddings)
    : act(config.decoder.activation) {
  const auto& d = config.decoder;
  auto transform = register_module("transform", std::make_shared<torch::nn::Module>());
  transform_dense = transform->register_module("dense", nn::make_linear("transform.dense", d.hidden_size, d.hidden_size, true));
  transform_norm = transform->register_module("LayerNorm", layer_norm(config));
  // The decoder's weight is the embedding table when tied; its bias is this head's `bias`. One tensor
  // under two names each, so loading and gradients see a single parameter.
  decoder = register_module("decoder", std::make_shared<torch::nn::Module>());
  decoder_weight = word_embeddings;
  if (!decoder_weight.defined()) {
    decoder_weight = nn::new_parameter({d.vocab_size, d.hidden_size});
  }
  decoder->register_parameter("weight", decoder_weight);
  bias = register_parameter("bias", at::zeros({d.vocab_size}));
  decoder->register_parameter("bias", bias);
}

at::Tensor BertLMPredictionHead::forward(const at::Tensor& hidden) const {
  auto h = transform_norm->forward(nn::activate(act, transform_dense->forward(hidden)));
  return nn::linear(h, decoder_weight, bias);  // [B, T, V]
}

BertForMaskedLM::BertForMaskedLM(const BuildContext& ctx)
    : roles::BertForMaskedLM(model_config(ctx), "BertForMaskedLM") {
  const BuildContext base = BuildContext{config(), -1, ctx.path}.child("bert", {{"add_pooling_layer", false}});
  bert = register_module("bert", build<roles::BertModel>("BertModel", base));
  at::Tensor table;
  if (config().decoder.tie_word_embeddings) {
    for (const auto& p : bert->named_parameters()) {
      if (p.key() == "embeddings.word_embeddings.weight") table = p.value();
    }
    if (!table.defined()) {
      throw PatchError(fmt::format("BertForMaskedLM: the decoder is tied to bert.embeddings.word_embeddings.weight, "
                                   "which {} does not have",
                                   bert->patch_record().class_name));
    }
  }
  auto cls = register_module("cls", std::make_shared<torch::nn::Module>());
  BuildSubmodule head_path("cls.predictions");  // the head's projections sit at cls.predictions.*
  predictions = cls->register_module("predictions", std::make_shared<BertLMPredictionHead>(config(), table));
}

ModelOutput BertForMaskedLM::forward_impl(const ModelInputs& in) {
  ModelInputs inner = in;
  inner.labels = at::Tensor();
  auto out = bert->forward(inner);
  out.logits = predictions->forward(out.last_hidden_state);
  return out;
}

void BertForMaskedLM::complete(const ModelInputs& in, ModelOutput& out) const {
  if (in.labels.defined()) out.loss = nn::masked_lm_loss(out.logits, in.labels);
}

std::map<std::string, std::string> BertForMaskedLM::tied_weights() const {
  std::map<std::string, std::string> tied{{"cls.predictions.decoder.bias", "cls.predictions.bias"}};
  if (config().decoder.tie_word_embeddings) {
    tied["cls.predictions.decoder.weight"] = "bert.embeddings.word_embeddings.weight";
  }
  return tied;
}

}  // namespace bert

// --- family ---------------------------------------------------------------------------------------

namespace bert {

Family family() {
  DecoderTraits traits;  // BertConfig defaults
  auto& d = traits.defaults;
  d.vocab_size = 30522;
  d.hidden_size = 768;
  d.intermediate_size = 3072;
  d.num_hidden_layers = 12;
  d.num_attention_heads = 12;
  d.num_key_value_heads = 0;  // as many as attention heads
  d.max_position_embeddings = 512;
  d.hidden_act = "gelu";
  d.tie_word_embeddings = true;
  Family family;
  family.model_type = "bert";
  family.parse_config = [traits](const nlohmann::json& j, const std::string& source) {
    auto config = parse_decoder_config(j, source, traits);
    ConfigReader f(j, source);
    auto bert = std::make_shared<BertConfig>();
    bert->type_vocab_size = f.positive("type_vocab_size", bert->type_vocab_size);
    bert->layer_norm_eps = f.number("layer_norm_eps", bert->layer_norm_eps);
    if (bert->layer_norm_eps < 0) {
      throw ConfigError(fmt::format("{}: layer_norm_eps must be >= 0, got {}", source, bert->layer_norm_eps));
    }
    bert->is_decoder = f.boolean("is_decoder", bert->is_decoder);
    bert->add_cross_attention = f.boolean("add_cross_attention", bert->add_cross_attention);
    if (bert->add_cross_attention && !bert->is_decoder) {
      f.fail("add_cross_attention needs is_decoder (cross-attention belongs to a decoder)");
    }
    const std::string embedding = f.string("position_embedding_type", "absolute");
    if (embedding != "absolute") {
      f.fail(fmt::format("position_embedding_type '{}' is not supported (only 'absolute')", embedding));
    }
    config.fields = std::move(bert);
    return config;
  };
  for (const char* model : {"BertModel", "BertForMaskedLM"}) {
    family.model_classes[model] = [model](const ModelConfig& c) -> std::shared_ptr<PretrainedModel> {
      if (std::string(model) == "BertModel") return build<roles::BertModel>(model, BuildContext{c, -1, ""});
      return build<roles::BertForMaskedLM>(model, BuildContext{c, -1, ""});
    };
    family.recorders[model]["attentions"] = {"BertSelfAttention", 1, ""};
    family.recorders[model]["cross_attentions"] = {"BertCrossAttention", 1, ""};
  }
  family.default_class = "BertModel";
  family.patch_points = {
      module_class<BertEmbeddings>("BertEmbeddings"),         module_class<BertSelfAttention>("BertSelfAttention"),
      module_class<BertCrossAttention>("BertCrossAttention"), module_class<BertSelfOutput>("BertSelfOutput"),
      module_class<BertAttention>("BertAttention"),           module_class<BertIntermediate>("BertIntermediate"),
      module_class<BertOutput>("BertOutput"),                 module_class<BertLayer>("BertLayer"),
      module_class<BertEncoder>("BertEncoder"),               module_class<BertPooler>("BertPooler"),
      module_class<BertModel>("BertModel"),                   module_class<BertForMaskedLM>("BertForMaskedLM")};
  family.presets = {{"tiny-bert",
                     {{"architectures", {"BertModel"}}, {"model_type", "bert"}, {"vocab_size", 256}, {"hidden_size", 64},
                      {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                      {"max_position_embeddings", 128}, {"type_vocab_size", 2}, {"layer_norm_eps", 1e-12}}}};
  return family;
}

}  // namespace bert
}  // namespace torchpatch
