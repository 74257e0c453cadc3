#include "torchpatch/models/auto.h"

#include <cmath>
#include <optional>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "torchpatch/checkpoint/load.h"
#include "torchpatch/error.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/patching/scope.h"
#include "models/families.h"

namespace torchpatch {

const std::map<std::string, FamilyEntry>& families() {
  static const std::map<std::string, FamilyEntry> all = [] {
    std::map<std::string, FamilyEntry> m;
    for (auto family : {llama_family(), mistral_family(), qwen2_family(), qwen2_moe_family(), qwen3_moe_family(), bert_family()}) m.emplace(family.model_type, std::move(family));
    return m;
  }();
  return all;
}

std::vector<std::string> supported_model_types() {
  std::vector<std::string> types;
  for (const auto& [type, family] : families()) types.push_back(type);
  return types;
}

const FamilyEntry& family_of(const std::string& model_type, const std::string& source) {
  auto it = families().find(model_type);
  if (it == families().end()) {
    throw ConfigError(fmt::format("{}: model_type '{}' is not supported (supported: {})", source, model_type,
                                  fmt::join(supported_model_types(), ", ")));
  }
  return it->second;
}

std::shared_ptr<PretrainedModel> construct_model(const ModelConfig& config) {
  const FamilyEntry& family = family_of(config.model_type, "config");
  std::string cls = family.default_class;
  const auto& arch = config.raw.find("architectures");
  if (arch != config.raw.end() && arch->is_array() && !arch->empty() && arch->front().is_string()) {
    const auto name = arch->front().get<std::string>();
    if (family.classes.count(name)) cls = name;
  }
  return family.classes.at(cls)(config);
}

std::shared_ptr<PretrainedModel> from_config(const ModelConfig& config) {
  if (active_patch_mapping()) return construct_model(config);
  ApplyPatches scope;
  return construct_model(config);
}

std::shared_ptr<PretrainedModel> from_pretrained(const std::filesystem::path& dir, const PretrainedOptions& options,
                                                 checkpoint::LoadReport* report) {
  auto config = ModelConfig::from_file(dir);
  if (!options.config_overrides.empty()) {
    auto raw = config.raw;
    raw.update(options.config_overrides);
    config = ModelConfig::from_json(raw, (dir / "config.json").string() + " (with overrides)");
  }
  const auto weights = checkpoint::Checkpoint::open(std::filesystem::is_directory(dir) ? dir : dir.parent_path());
  std::shared_ptr<PretrainedModel> model;
  {
    nn::SkipInit skip;  // the checkpoint provides the values (the report says what it did not)
    model = from_config(config);
  }
  if (options.dtype) model->to(*options.dtype);
  auto result = checkpoint::load_weights(*model, weights, checkpoint::LoadOptions{options.strict});
  if (report) *report = std::move(result);
  return model;
}

namespace {
// Built-in models with fixed shapes: tiny ones for demos and tests, a 125M Llama for benchmarks.
const std::vector<std::pair<std::string, nlohmann::json>>& presets() {
  static const std::vector<std::pair<std::string, nlohmann::json>> all = [] {
    const nlohmann::json tiny{{"vocab_size", 256}, {"hidden_size", 64}, {"intermediate_size", 128},
                              {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                              {"max_position_embeddings", 256}, {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0}};
    auto with = [&](nlohmann::json base, const nlohmann::json& extra) {
      base.update(extra);
      return base;
    };
    return std::vector<std::pair<std::string, nlohmann::json>>{
        {"tiny-llama", with(tiny, {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}})},
        {"tiny-mistral",
         with(tiny, {{"architectures", {"MistralForCausalLM"}}, {"model_type", "mistral"}, {"sliding_window", 8}})},
        {"tiny-qwen2", with(tiny, {{"architectures", {"Qwen2ForCausalLM"}}, {"model_type", "qwen2"},
                                   {"use_sliding_window", true}, {"sliding_window", 8}, {"max_window_layers", 1}})},
        {"tiny-bert",
         {{"architectures", {"BertModel"}}, {"model_type", "bert"}, {"vocab_size", 256}, {"hidden_size", 64},
          {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"max_position_embeddings", 128}, {"type_vocab_size", 2}, {"layer_norm_eps", 1e-12}}},
        {"qwen2-moe-125m",
         {{"architectures", {"Qwen2MoeForCausalLM"}}, {"model_type", "qwen2_moe"}, {"vocab_size", 32000},
          {"hidden_size", 512}, {"intermediate_size", 1408}, {"num_hidden_layers", 8}, {"num_attention_heads", 8},
          {"num_key_value_heads", 8}, {"max_position_embeddings", 2048}, {"rms_norm_eps", 1e-6},
          {"num_experts", 16}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 384},
          {"shared_expert_intermediate_size", 768}, {"norm_topk_prob", false}, {"rope_theta", 1000000.0}}},
        {"llama-125m",
         {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", 32000}, {"hidden_size", 768},
          {"intermediate_size", 2048}, {"num_hidden_layers", 12}, {"num_attention_heads", 12},
          {"num_key_value_heads", 4}, {"max_position_embeddings", 2048}, {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0}}},
    };
  }();
  return all;
}
}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, json] : presets()) names.push_back(name);
  return names;
}

ModelConfig preset_config(const std::string& name) {
  for (const auto& [preset, json] : presets()) {
    if (preset == name) return ModelConfig::from_json(json, "preset " + name);
  }
  throw ConfigError(fmt::format("unknown preset '{}' (presets: {})", name, fmt::join(preset_names(), ", ")));
}

void init_random_weights(torch::nn::Module& model, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    const auto& name = item.key();
    auto& p = item.value();
    auto noise = at::normal(0.0, 1.0, p.sizes(), gen, p.options());
    const bool norm = name.find("norm") != std::string::npos || name.find("LayerNorm") != std::string::npos;
    if (norm && p.dim() == 1 && name.compare(name.size() - 5, 5, ".bias") != 0) {
      p.copy_(1.0 + 0.1 * noise);
    } else if (name.find("embed") != std::string::npos || p.dim() < 2) {
      p.copy_(p.dim() < 2 ? 0.1 * noise : noise);
    } else {
      p.copy_(noise / std::sqrt(static_cast<double>(p.size(1))));
    }
  }
}

}  // namespace torchpatch
