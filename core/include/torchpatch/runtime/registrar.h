// The Registrar: what a plugin's register function fills in (see plugin_api.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "torchpatch/checkpoint/conversion.h"
#include "torchpatch/export.h"
#include "torchpatch/models/family.h"
#include "torchpatch/patching/module_class.h"

namespace torchpatch {

/// Nothing a plugin adds is applied until its register function returns without throwing; then the
/// host registers everything or nothing.
class TORCHPATCH_API Registrar {
 public:
  virtual ~Registrar();

  /// Offers `cls` as the replacement for `keys` (Hugging Face class names or regular expressions).
  /// Loaded as a drop-in plugin, the host registers it under those keys; loaded as a catalogue,
  /// the class can be chosen by name (`--patch KEY=CLASS`). An empty `keys` offers the class by name only.
  virtual void add_replacement(ModuleClass cls, const std::vector<std::string>& keys) = 0;

  /// Conversion rules for a model type ("llama"), a model class, or a patch-point class such as the
  /// plugin's own replacement (then they apply under every module of that class, on load and, reversed,
  /// on save). Registered with the plugin's replacements; a key another plugin already holds is a conflict.
  virtual void add_conversion(const std::string& model_type_or_class, checkpoint::ConversionFactory rules) = 0;

  /// A whole model family (a model_type and everything that comes with it, see models/family.h).
  /// Whether the plugin is loaded drop-in or as a catalogue, `--model DIR` with that model_type then
  /// works: a family replaces nothing by being available. A model_type another plugin or the core
  /// already provides is a conflict that refuses the plugin.
  virtual void add_family(Family family) = 0;

  /// A quantization method (models/family.h): models whose config has a `quantization_config`
  /// naming it are built with its patches. Available however the plugin is loaded; a name another
  /// plugin already provides is a conflict that refuses the plugin.
  virtual void add_quantization_method(QuantizationMethod method) = 0;
  /// Shorthand, in the same order: the ModuleClass of `Impl` (constructible from a BuildContext)
  /// named `class_name`, offered for `keys`, running on `devices` (empty: the CPU only; a class whose
  /// forward uses LibTorch's operations alone runs on CUDA too and says {c10::kCPU, c10::kCUDA}).
  template <typename Impl>
  void add_replacement(std::string class_name, const std::vector<std::string>& keys, DeviceTypes devices = {}) {
    add_replacement(with_devices(module_class<Impl>(std::move(class_name)), std::move(devices)), keys);
  }
};

}  // namespace torchpatch
