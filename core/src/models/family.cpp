#include "torchpatch/models/family.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/error.h"
#include "torchpatch/printable.h"
#include "torchpatch/patching/class_table.h"

namespace torchpatch {

std::string Family::kind_of(const std::string& cls) const {
  for (const auto& point : patch_points) {
    if (point.name == cls) return point.kind;
  }
  return {};
}

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
  for (auto& cls : family.patch_points) cls.origin = family.origin;
  for (const auto& cls : family.patch_points) {
    if (auto clash = classes_.clash(cls)) {
      throw PatchError(fmt::format("family '{}' from {}: {}", family.model_type, family.origin.describe(), *clash));
    }
  }
  for (const auto& cls : family.patch_points) classes_.add(cls);
  for (const auto& [model_class, named] : family.recorders) {
    for (const auto& [name, recorder] : named) recorders_.add(model_class, name, recorder);
  }
  if (family.conversions) conversions_.add(family.model_type, family.conversions, /*overwrite=*/true, family.origin);
  const std::string model_type = family.model_type;
  families_.emplace(model_type, std::make_shared<const Family>(std::move(family)));
}

void FamilyRegistry::add_shared_patch_point(const ModuleClass& cls) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto clash = classes_.clash(cls)) throw PatchError(fmt::format("shared patch point: {}", *clash));
  classes_.add(cls);
}

void FamilyRegistry::add_quantization_method(QuantizationMethod method) {
  if (method.name.empty() || !method.patches) {
    throw Error(fmt::format("quantization method from {}: needs a name and its patches", method.origin.describe()));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = quantization_methods_.find(method.name); it != quantization_methods_.end()) {
    throw Error(fmt::format("quantization method '{}' is already provided by {}; {} cannot provide it again",
                            method.name, it->second->origin.describe(), method.origin.describe()));
  }
  const std::string name = method.name;
  quantization_methods_.emplace(name, std::make_shared<const QuantizationMethod>(std::move(method)));
}

std::shared_ptr<const QuantizationMethod> FamilyRegistry::quantization_method(const std::string& quant_method) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = quantization_methods_.find(quant_method);
  return it == quantization_methods_.end() ? nullptr : it->second;
}

std::vector<std::string> FamilyRegistry::quantization_methods() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> names;
  for (const auto& [name, method] : quantization_methods_) names.push_back(name);
  return names;
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

std::vector<std::string> FamilyRegistry::model_types() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> types;
  for (const auto& [type, family] : families_) types.push_back(type);
  return types;
}

std::shared_ptr<const Family> FamilyRegistry::find_gguf(const GgufMetadata& metadata) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [type, family] : families_) {
    if (!family->gguf) continue;
    const auto& names = family->gguf->names;
    if (std::find(names.begin(), names.end(), metadata.architecture()) == names.end()) continue;
    if (!family->gguf->accepts || family->gguf->accepts(metadata)) return family;
  }
  return nullptr;
}

std::vector<std::string> FamilyRegistry::gguf_architectures() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> names;
  for (const auto& [type, family] : families_) {
    if (family->gguf) names.insert(names.end(), family->gguf->names.begin(), family->gguf->names.end());
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());  // "llama": Llama's and Mixtral's
  return names;
}

std::shared_ptr<const Family> family_of(const std::string& model_type, const std::string& source,
                                        const FamilyRegistry& families) {
  if (auto family = families.find(model_type)) return family;
  throw ConfigError(fmt::format("{}: model_type '{}' is not supported (supported: {})", source, printable(model_type, 200),
                                fmt::join(families.model_types(), ", ")));
}

std::vector<std::string> supported_model_types() { return global_families().model_types(); }

}  // namespace torchpatch
