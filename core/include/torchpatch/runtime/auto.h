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
#include "torchpatch/runtime/registries.h"

namespace torchpatch {

/// Builds the model class `config` names (its `architectures[0]`, else the family's default class)
/// from the families of `registries`. Plain construction: replacements apply only inside an open
/// ApplyPatches scope (outside one, the build uses the classes and recorders of `registries`).
TORCHPATCH_API std::shared_ptr<PretrainedModel> construct_model(const ModelConfig& config,
                                                                const Registries& registries = default_registries());

/// Builds with the patches of `registries` applied (opens an ApplyPatches scope over them unless one
/// is open). Weights are left as constructed.
TORCHPATCH_API std::shared_ptr<PretrainedModel> from_config(const ModelConfig& config,
                                                            const Registries& registries = default_registries());

/// How from_pretrained loads.
struct TORCHPATCH_API PretrainedOptions {
  /// Parameters in this dtype (float32, bfloat16, float16); by default as constructed (float32).
  std::optional<c10::ScalarType> dtype;
  /// Where the model runs: the CPU, or a CUDA GPU (check_device says whether this machine and build
  /// have it). The model is built on the host without touching its memory, moved to the device in
  /// its dtype, then the checkpoint's tensors are copied there one by one.
  c10::Device device = c10::Device(c10::kCPU);
  /// See checkpoint::LoadOptions: non-strict loading leaves what is missing initialised.
  bool strict = true;
  /// config.json fields to set before building, e.g. {"experts_implementation": "eager"}.
  nlohmann::json config_overrides = nlohmann::json::object();
  /// Families, patches and conversions to build and load with.
  Registries registries = default_registries();
  /// Refuse, before anything is allocated, a config whose parameters need more than this machine's
  /// physical memory (a model that large would be killed by the kernel half-way through building).
  bool check_memory = true;
  /// NaN or infinity in a loaded tensor is an error (otherwise the report lists it).
  bool reject_non_finite = false;
  /// Copy weights out of the memory-mapped checkpoint (checkpoint::LoadOptions::copy_mapped): a
  /// slower load, a faster decode.
  bool copy_weights = false;
  /// Hears the checkpoint's bytes loaded so far (checkpoint::LoadOptions::progress).
  checkpoint::Progress progress;
  /// A GGUF file's projections are dequantized to float32 even where a loaded quantization method
  /// multiplies their blocks (read_gguf_model).
  bool dequantize = false;
};

/// Throws DeviceError, naming each module path and class, if a module of `model` cannot run on
/// `device` (ModuleClass::devices: a plugin's class runs on the CPU unless it says otherwise).
/// from_pretrained and preset_model check this before moving a model.
TORCHPATCH_API void check_device_support(const PretrainedModel& model, c10::Device device);

/// `config` with `overrides` written over its config.json fields, parsed again by the families of
/// `registries` (so they are checked); `config` itself when there are none. `source` names it in messages.
TORCHPATCH_API ModelConfig with_overrides(const ModelConfig& config, const nlohmann::json& overrides,
                                          const std::string& source,
                                          const Registries& registries = default_registries());

/// Reads `dir/config.json` and the weights (`model.safetensors` or shards with
/// `model.safetensors.index.json`), builds with the registered patches applied and loads the weights
/// through the conversion rules. Throws CheckpointError / ConfigError naming the file and the fault.
/// `report`, when given, receives the loading report. A class that cannot run on `options.device`
/// is a DeviceError naming it.
TORCHPATCH_API std::shared_ptr<PretrainedModel> from_pretrained(const std::filesystem::path& dir,
                                                                const PretrainedOptions& options = {},
                                                                checkpoint::LoadReport* report = nullptr);


/// The config's `quantization_config` object, or nullptr when it has none (ConfigError when it is
/// not an object).
TORCHPATCH_API const nlohmann::json* quantization_config(const ModelConfig& config);

/// `base` with the patches of the quantization method the config's `quantization_config` names added
/// for the keys `base` does not map; nullopt for a config without one. A method no loaded plugin
/// provides is a ConfigError naming it. from_config and from_pretrained build through this.
TORCHPATCH_API std::optional<PatchMapping> quantized_mapping(const ModelConfig& config, const Registries& registries,
                                                             const PatchMapping& base);

/// Built-in tiny models with fixed seeds, runnable without downloads: the presets of every family.
TORCHPATCH_API std::vector<std::string> preset_names(const Registries& registries = default_registries());
/// The config of preset `name` (throws ConfigError listing the presets for an unknown name).
TORCHPATCH_API ModelConfig preset_config(const std::string& name, const Registries& registries = default_registries());
/// Preset `name` built with the patches of `options.registries` in force, its random weights drawn
/// from `seed` (init_random_weights), then config overrides and dtype applied as from_pretrained does.
TORCHPATCH_API std::shared_ptr<PretrainedModel> preset_model(const std::string& name, uint64_t seed,
                                                             const PretrainedOptions& options = {});
/// Deterministic random weights: Linear ~ N(0,1)/sqrt(in), embeddings N(0,1), norms 1+0.1*N(0,1).
TORCHPATCH_API void init_random_weights(torch::nn::Module& model, uint64_t seed);

}  // namespace torchpatch
