// Building models by config: Hugging Face's AutoModel.from_config / from_pretrained.
#pragma once

#include "torchpatch/export.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "torchpatch/checkpoint/load.h"
#include "torchpatch/models/family.h"
#include "torchpatch/models/pretrained.h"

namespace torchpatch {

/// Builds the model class `config` names (its `architectures[0]`, else the family's causal LM).
/// Plain construction: replacements apply only inside an open ApplyPatches scope.
TORCHPATCH_API std::shared_ptr<PretrainedModel> construct_model(const ModelConfig& config);

/// Builds with the registered patches applied (opens an ApplyPatches scope unless one is open).
/// Weights are left as constructed.
TORCHPATCH_API std::shared_ptr<PretrainedModel> from_config(const ModelConfig& config);

/// How from_pretrained loads.
struct TORCHPATCH_API PretrainedOptions {
  /// Parameters in this dtype (float32, bfloat16, float16); by default as constructed (float32).
  std::optional<c10::ScalarType> dtype;
  /// See checkpoint::LoadOptions: non-strict loading leaves what is missing initialised.
  bool strict = true;
  /// config.json fields to set before building, e.g. {"experts_implementation": "eager"}.
  nlohmann::json config_overrides = nlohmann::json::object();
};

/// `config` with `overrides` written over its config.json fields, parsed again (so they are checked);
/// `config` itself when there are none. `source` names it in messages.
TORCHPATCH_API ModelConfig with_overrides(const ModelConfig& config, const nlohmann::json& overrides,
                                          const std::string& source);

/// Reads `dir/config.json` and the weights (`model.safetensors` or shards with
/// `model.safetensors.index.json`), builds with the registered patches applied and loads the weights
/// through the conversion rules. Throws CheckpointError / ConfigError naming the file and the fault.
/// `report`, when given, receives the loading report.
TORCHPATCH_API std::shared_ptr<PretrainedModel> from_pretrained(const std::filesystem::path& dir,
                                                                const PretrainedOptions& options = {},
                                                                checkpoint::LoadReport* report = nullptr);


/// Built-in tiny models with fixed seeds, runnable without downloads.
TORCHPATCH_API std::vector<std::string> preset_names();
/// The config of preset `name` (throws ConfigError listing the presets for an unknown name).
TORCHPATCH_API ModelConfig preset_config(const std::string& name);
/// Deterministic random weights: Linear ~ N(0,1)/sqrt(in), embeddings N(0,1), norms 1+0.1*N(0,1).
TORCHPATCH_API void init_random_weights(torch::nn::Module& model, uint64_t seed);

}  // namespace torchpatch
