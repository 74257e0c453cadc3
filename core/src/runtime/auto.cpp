#include "torchpatch/runtime/auto.h"

#include <cmath>
#include <optional>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "torchpatch/checkpoint/load.h"
#include "torchpatch/error.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/patching/scope.h"
#include "torchpatch/models/family.h"

namespace torchpatch {

std::shared_ptr<PretrainedModel> construct_model(const ModelConfig& config) {
  const auto family = family_of(config.model_type, "config");
  std::string cls = family->default_class;
  const auto& arch = config.raw.find("architectures");
  if (arch != config.raw.end() && arch->is_array() && !arch->empty() && arch->front().is_string()) {
    const auto name = arch->front().get<std::string>();
    if (family->model_classes.count(name)) cls = name;
  }
  return family->model_classes.at(cls)(config);
}

std::shared_ptr<PretrainedModel> from_config(const ModelConfig& config) {
  if (active_patch_mapping()) return construct_model(config);
  ApplyPatches scope;
  return construct_model(config);
}

ModelConfig with_overrides(const ModelConfig& config, const nlohmann::json& overrides, const std::string& source) {
  if (overrides.empty()) return config;
  auto raw = config.raw;
  raw.update(overrides);
  return ModelConfig::from_json(raw, source);
}

std::shared_ptr<PretrainedModel> from_pretrained(const std::filesystem::path& dir, const PretrainedOptions& options,
                                                 checkpoint::LoadReport* report) {
  const auto config = with_overrides(ModelConfig::from_file(dir), options.config_overrides,
                                     (dir / "config.json").string() + " (with overrides)");
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
// Built-in models with fixed shapes, from every family: tiny ones for demos and tests, larger ones
// for benchmarks.
std::vector<std::pair<std::string, nlohmann::json>> presets() {
  std::vector<std::pair<std::string, nlohmann::json>> all;
  for (const auto& family : global_families().all()) {
    all.insert(all.end(), family->presets.begin(), family->presets.end());
  }
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
