// The Family descriptor of a decoder family, from its classes, names and config rules: what a
// family file (llama.cpp, ...) registers. Included by family files only.
#pragma once

#include <string>
#include <type_traits>
#include <utility>

#include "torchpatch/models/decoder.h"
#include "torchpatch/models/family.h"
#include "torchpatch/patching/build.h"

namespace torchpatch {

/// The shapes of the tiny presets (demos and tests): 2 layers, hidden 64, 4 heads over 2 KV heads.
inline nlohmann::json tiny_decoder_preset(const std::string& model_type, const std::string& causal_lm) {
  return {{"architectures", {causal_lm}}, {"model_type", model_type}, {"vocab_size", 256}, {"hidden_size", 64},
          {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"max_position_embeddings", 256}, {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0}};
}

/// Model classes built through their patch points, so a whole model can be replaced too.
inline void add_model_classes(Family& family, const DecoderSpec& spec) {
  family.model_classes[spec.causal_lm] = [key = spec.causal_lm](const ModelConfig& c) -> std::shared_ptr<PretrainedModel> {
    return build<DecoderForCausalLM>(key, BuildContext{c, -1, ""});
  };
  family.model_classes[spec.base_model] = [key = spec.base_model](const ModelConfig& c) -> std::shared_ptr<PretrainedModel> {
    return build<DecoderModel>(key, BuildContext{c, -1, ""});
  };
  family.default_class = spec.causal_lm;
  // Attention probabilities (attention output 1), for every decoder family.
  for (const auto& model : {spec.causal_lm, spec.base_model}) family.recorders[model]["attentions"] = {spec.attention, 1, ""};
}

/// The block_kind of an attention class, from the shared block it derives from ("" for another).
template <class Attention>
constexpr const char* attention_kind() {
  if constexpr (std::is_base_of_v<nn::QkNormAttention, Attention>) return block_kind::kQkNormAttention;
  else if constexpr (std::is_base_of_v<nn::GqaAttention, Attention>) return block_kind::kAttention;
  else if constexpr (std::is_base_of_v<FusedQkvAttention, Attention>) return block_kind::kFusedQkvAttention;
  else return "";
}

/// The block_kind of a router class, from the shared block it derives from ("" for another).
template <class Router>
constexpr const char* router_kind() {
  if constexpr (std::is_base_of_v<nn::TopKRouter, Router>) return block_kind::kRouter;
  else if constexpr (std::is_base_of_v<nn::GroupedTopKRouter, Router>) return block_kind::kGroupedRouter;
  else if constexpr (std::is_base_of_v<nn::SoftmaxOfTopKRouter, Router>) return block_kind::kSoftmaxOfTopKRouter;
  else return "";
}

/// The block_kind of an experts class, from the shared block it derives from ("" for another).
template <class Experts>
constexpr const char* experts_kind() {
  if constexpr (std::is_base_of_v<nn::FusedExperts, Experts>) return block_kind::kExperts;
  else if constexpr (std::is_base_of_v<nn::ClampedSwigluExperts, Experts>) return block_kind::kClampedSwigluExperts;
  else return "";
}

/// A decoder family on the shared blocks: `Attention`, `Mlp`, `Norm`, `Layer`, `Base` and `CausalLM`
/// are its classes (each constructible from a BuildContext), registered under `spec`'s keys.
template <class Attention, class Mlp, class Norm, class Layer, class Base, class CausalLM>
Family decoder_family(std::string model_type, const DecoderSpec& spec, DecoderTraits traits) {
  Family family;
  family.model_type = std::move(model_type);
  family.parse_config = [traits = std::move(traits)](const nlohmann::json& j, const std::string& source) {
    return parse_decoder_config(j, source, traits);
  };
  add_model_classes(family, spec);
  family.patch_points = {with_kind(module_class<Attention>(spec.attention), attention_kind<Attention>()),
                         module_class<Norm>(spec.norm), module_class<Layer>(spec.decoder_layer),
                         module_class<Base>(spec.base_model), module_class<CausalLM>(spec.causal_lm)};
  // Mlp is void for a family whose every layer is sparse (Mixtral): it has no dense MLP class.
  if constexpr (!std::is_void_v<Mlp>) {
    family.patch_points.push_back(
        with_kind(module_class<Mlp>(spec.mlp), std::is_base_of_v<nn::GatedMlp, Mlp> ? block_kind::kMlp : ""));
  }
  family.decoder = spec;
  return family;
}

/// DeepSeek's spelling of the shared experts (GLM-4.5, DeepSeek-V3): `n_shared_experts` (default 1)
/// experts of moe_intermediate_size each, run as one MLP that wide, ungated.
inline void read_shared_experts(const ConfigReader& f, MoeConfig& moe) {
  const int64_t shared = f.integer("n_shared_experts", 1);
  if (shared < 0) f.fail("field 'n_shared_experts' must not be negative, got " + std::to_string(shared));
  moe.shared_expert_intermediate_size = shared * moe.moe_intermediate_size;
}

/// The conversion of a MoE family's experts: the per-expert hub weights (named as `layout` says) fused
/// into nn::FusedExperts' stacked [E, ...] parameters, and back on save.
inline checkpoint::ConversionRules experts_conversion(const ExpertsLayout& layout) {
  using namespace checkpoint;
  const auto expert = [&](const std::string& proj) { return layout.block + ".experts.*." + proj + ".weight"; };
  return {WeightConverter{{expert(layout.gate), expert(layout.up)},
                          {layout.block + ".experts.gate_up_proj"},
                          {MergeModulelist(0), Concatenate(1)}},
          WeightConverter{{expert(layout.down)}, {layout.block + ".experts.down_proj"}, {MergeModulelist(0)}}};
}

/// Adds a MoE family's sparse block, router and experts, their conversions (experts_conversion of the
/// spec's layout) and their recorders.
template <class Block, class Router, class Experts>
void add_moe_parts(Family& family, const DecoderSpec& spec) {
  family.patch_points.push_back(with_kind(module_class<Block>(spec.sparse_block), block_kind::kSparseBlock));
  family.patch_points.push_back(with_kind(module_class<Router>(spec.router), router_kind<Router>()));
  family.patch_points.push_back(with_kind(module_class<Experts>(spec.experts), experts_kind<Experts>()));
  family.conversions = [layout = spec.experts_layout](const Config&) { return experts_conversion(layout); };
  // Router logits (router output 0, as Hugging Face records them) and the routing itself: the weights
  // applied (output 1) and the experts chosen (output 2).
  for (const auto& model : {spec.causal_lm, spec.base_model}) {
    auto& named = family.recorders[model];
    named["router_logits"] = {spec.router, 0, ""};
    named["routing_weights"] = {spec.router, 1, ""};
    named["selected_experts"] = {spec.router, 2, ""};
  }
}

}  // namespace torchpatch
