// What loading and saving need of a model: its parameters, its class and config (to find conversion
// rules), its patch points (rules of replacement classes), its tied weights and base-model prefix.
// Models implement it; the checkpoint layer knows no model.
#pragma once

#include "torchpatch/export.h"

#include <map>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "torchpatch/config.h"
#include "torchpatch/patching/module_class.h"

namespace torchpatch::checkpoint {

class TORCHPATCH_API Loadable {
 public:
  virtual ~Loadable();

  /// The module whose parameters load and save.
  virtual torch::nn::Module& module() = 0;
  virtual const torch::nn::Module& module() const = 0;
  /// Hugging Face class name, e.g. "LlamaForCausalLM" (conversion rules by class).
  virtual const std::string& class_name() const = 0;
  /// The config (conversion rules by model_type, and the config.json written on save).
  virtual const Config& config() const = 0;
  /// Modules built through patch points (conversion rules of their classes apply under them).
  virtual std::vector<PatchPoint> patch_points() const = 0;
  /// State-dict keys that share another key's tensor and are absent from checkpoints.
  virtual std::map<std::string, std::string> tied_weights() const = 0;
  /// Where a task head keeps the base model ("model", "bert"); "" for none.
  virtual std::string base_model_prefix() const = 0;
  /// Starts of checkpoint keys to leave out without complaint when they name no parameter.
  virtual std::vector<std::string> ignored_checkpoint_keys() const = 0;
  /// config.json as save_pretrained writes it.
  virtual nlohmann::json config_json() const = 0;
};

}  // namespace torchpatch::checkpoint
