// Internal: what each model family contributes to the shared tables (patch points, defaults, classes).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "torchpatch/models/config.h"
#include "torchpatch/models/pretrained.h"
#include "torchpatch/patching/module_class.h"

namespace torchpatch {

/// A family: its model_type, Hugging Face's config defaults, and its model classes by name.
struct FamilyEntry {
  std::string model_type;
  DecoderConfig defaults;
  std::string default_class;  ///< built when config.json names no known architecture
  std::map<std::string, std::function<std::shared_ptr<PretrainedModel>(const ModelConfig&)>> classes;
};

const std::map<std::string, FamilyEntry>& families();

/// Defaults of `model_type`; ConfigError listing the supported types for an unknown one.
DecoderConfig family_defaults(const std::string& model_type, const std::string& source);

// Per-family contributions.
FamilyEntry llama_family();
void add_llama_builtins(std::map<std::string, ModuleClass>& classes);

}  // namespace torchpatch
