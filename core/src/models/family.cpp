#include "torchpatch/models/family.h"

#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/patching/class_table.h"

namespace torchpatch {

void FamilyRegistry::add(Family family) {
  if (family.model_type.empty() || !family.parse_config || family.model_classes.empty()) {
    throw Error(fmt::format("family '{}' from {}: needs a model_type, a config parser and at least one model class",
                            family.model_type, family.origin.describe()));
  }
  if (family.default_class.empty()) family.default_class = family.model_classes.begin()->first;
  if (!family.model_classes.count(family.default_class)) {
    throw Error(fmt::format("family '{}': default class '{}' is not one of its model classes", family.model_type,
                            family.default_class));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = families_.find(family.model_type); it != families_.end()) {
    throw Error(fmt::format("model_type '{}' is already provided by {}; {} cannot provide it again", family.model_type,
                            it->second->origin.describe(), family.origin.describe()));
  }
  // Patch points first: a clash there leaves nothing else registered.
  auto& classes = builtin_class_table();
  for (auto cls : family.patch_points) {
    cls.origin = family.origin;
    if (auto held = classes.find(cls.name); held && held->origin.plugin != cls.origin.plugin) {
      throw PatchError(fmt::format("family '{}' from {}: patch point '{}' is already defined by {}", family.model_type,
                                   family.origin.describe(), cls.name, held->origin.describe()));
    }
  }
  for (auto cls : family.patch_points) {
    cls.origin = family.origin;
    classes.add(cls);
  }
  for (const auto& [model_class, named] : family.recorders) {
    for (const auto& [name, recorder] : named) register_output_recorder(model_class, name, recorder);
  }
  if (family.conversions) {
    checkpoint::register_checkpoint_conversion_mapping(family.model_type, family.conversions, /*overwrite=*/true,
                                                       family.origin);
  }
  const std::string model_type = family.model_type;
  families_.emplace(model_type, std::make_shared<const Family>(std::move(family)));
}

std::shared_ptr<const Family> FamilyRegistry::find(const std::string& model_type) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = families_.find(model_type);
  return it == families_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<const Family>> FamilyRegistry::all() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::shared_ptr<const Family>> out;
  for (const auto& [type, family] : families_) out.push_back(family);
  return out;
}

std::shared_ptr<const Family> family_of(const std::string& model_type, const std::string& source) {
  if (auto family = global_families().find(model_type)) return family;
  throw ConfigError(fmt::format("{}: model_type '{}' is not supported (supported: {})", source, model_type,
                                fmt::join(supported_model_types(), ", ")));
}

std::vector<std::string> supported_model_types() {
  std::vector<std::string> types;
  for (const auto& family : global_families().all()) types.push_back(family->model_type);
  return types;
}

}  // namespace torchpatch
