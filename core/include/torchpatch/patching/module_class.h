// What a patch point is built from: module classes (the C++ form of Python's `type[nn.Module]`),
// their origin, and the context a factory receives.
#pragma once

#include "torchpatch/export.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include "torchpatch/config.h"

namespace torchpatch {

/// Where a module class came from: built into libtorchpatch_core or loaded from a plugin file.
struct TORCHPATCH_API Origin {
  std::string plugin;   ///< plugin name; empty for built-in classes
  std::string version;  ///< plugin version
  std::string file;     ///< path of the plugin's shared object

  bool builtin() const { return plugin.empty(); }
  /// "builtin" or "plugin NAME VERSION (FILE)".
  std::string describe() const;
};

/// Everything a factory may use to build one module.
struct TORCHPATCH_API BuildContext {
  const Config& config;    ///< the whole model's configuration: `config.as<ModelConfig>()` for the typed fields
  int64_t layer_idx = -1;  ///< decoder layer index, -1 outside layers
  std::string path;        ///< dotted module path, e.g. "model.layers.3.self_attn"
  /// Keyword arguments the parent passes to the constructor, as Python's modules take them (a MoE
  /// block's shared expert gets {"intermediate_size": 768}); empty for most patch points.
  nlohmann::json args = nlohmann::json::object();

  /// The context of child `name` (path joined with a dot), in the same layer, with `args`.
  BuildContext child(const std::string& name, nlohmann::json child_args = nlohmann::json::object()) const;
  /// Integer keyword argument `name`, or `fallback` when not given.
  int64_t arg(const char* name, int64_t fallback) const;
  /// Boolean keyword argument `name`, or `fallback` when not given.
  bool flag(const char* name, bool fallback) const;
};

/// The device types a module class runs on. Empty: not said, which means every device for a
/// built-in class (LibTorch's operations, or torchpatch's kernels for each) and the CPU alone for a
/// plugin's class, whose code the host cannot see.
using DeviceTypes = std::vector<c10::DeviceType>;

/// Whether a class that declared `devices` (a built-in one when `builtin`) runs on `type`.
TORCHPATCH_API bool runs_on(const DeviceTypes& devices, bool builtin, c10::DeviceType type);

/// How the class of a built module was chosen.
struct TORCHPATCH_API PatchRecord {
  std::string key;          ///< the patch-point key asked for, e.g. "LlamaAttention"
  std::string class_name;   ///< the class actually built, e.g. "CustomLlamaAttention"
  std::string rule;         ///< "builtin", "exact key" or "pattern 'RX'"
  Origin origin;
  std::string path;  ///< where it was built, e.g. "model.layers.3.mlp.gate"
  /// Mapping entries for this key that a module-path filter kept away from here, and why
  /// ("rule 'Linear' (Q8_0Linear) excludes it by 'lm_head'"); "" when none was.
  std::string passed_over = {};
  /// The class's devices (ModuleClass::devices).
  DeviceTypes devices = {};
  /// Whether the module was built through a patch point (a model's own `model` part is not).
  bool built() const { return !key.empty(); }
  bool patched() const { return built() && rule != "builtin"; }
};

/// Base of every module built through a patch point. Remembers how it was chosen and can report
/// counters of its own (a call count, for example) to reports and the CLI.
class TORCHPATCH_API PatchableModule : public torch::nn::Module {
 public:
  PatchableModule() = default;
  ~PatchableModule() override;

  const PatchRecord& patch_record() const { return record_; }
  void set_patch_record(PatchRecord record) { record_ = std::move(record); }

  /// Named counters a replacement wants to show (empty by default).
  virtual std::map<std::string, int64_t> counters() const { return {}; }

 private:
  PatchRecord record_;
};

/// One patch point of a built model.
struct TORCHPATCH_API PatchPoint {
  std::string path;  ///< dotted module path, e.g. "model.layers.0.self_attn"
  std::shared_ptr<PatchableModule> module;
};

/// Which module paths a patch mapping entry applies to, the way quantizers' `modules_to_not_convert`
/// and Hugging Face's kernel configs select modules. Patterns are globs ('*' any run of characters,
/// '?' one character); a pattern matches a path when it matches the whole dotted path or a dotted
/// suffix of it, so "lm_head", "mlp.gate" and "*.mlp.gate" all say what they look like.
struct TORCHPATCH_API PathFilter {
  std::vector<std::string> include;  ///< the entry applies only under these (every path when empty)
  std::vector<std::string> exclude;  ///< ... and never under these

  bool empty() const { return include.empty() && exclude.empty(); }
  /// Whether the entry applies at `path`.
  bool admits(const std::string& path) const;
  /// The pattern of `patterns` that matches `path`, or nullptr.
  static const std::string* first_match(const std::vector<std::string>& patterns, const std::string& path);
  /// Why `path` is not admitted: "excludes it by 'lm_head'" or "applies only under [a, b]".
  std::string why_not(const std::string& path) const;
  /// "include [a, b], exclude [c]" (the parts that are set).
  std::string describe() const;
};

/// A module class: a name, the role it fills and a factory. Replacements and built-ins alike.
struct TORCHPATCH_API ModuleClass {
  using Factory = std::function<std::shared_ptr<PatchableModule>(const BuildContext&)>;
  std::string name;  ///< class name as users write it, e.g. "FusedQKVAttention"
  std::string role;  ///< role name, e.g. "Attention" (see roles.h)
  Factory factory;
  Origin origin;
  /// A built-in patch point's kind of shared block ("experts", "router", "attention", ...; the
  /// vocabulary is models/family.h's block_kind), "" for none. A mapping key written `{kind}` selects
  /// every patch point of that kind, whatever its family calls it.
  std::string kind = {};
  /// In a patch mapping: the module paths the entry applies to; elsewhere the patch point falls back
  /// to the next matching entry, then to the built-in class.
  PathFilter paths = {};
  /// Where its modules run (see DeviceTypes): a plugin whose class runs on CUDA says so, e.g.
  /// `with_devices(module_class<Impl>("Name"), {c10::kCPU, c10::kCUDA})`.
  DeviceTypes devices = {};
};

/// `cls` declared to run on `devices`.
TORCHPATCH_API ModuleClass with_devices(ModuleClass cls, DeviceTypes devices);

/// `cls` limited to the module paths `include` admits and `exclude` does not.
TORCHPATCH_API ModuleClass with_paths(ModuleClass cls, std::vector<std::string> include,
                                      std::vector<std::string> exclude = {});

/// `cls` as a patch point of kind `kind`.
TORCHPATCH_API ModuleClass with_kind(ModuleClass cls, std::string kind);

/// Makes the ModuleClass of an implementation type `Impl` that derives from a role and is
/// constructible from a BuildContext.
template <typename Impl>
ModuleClass module_class(std::string name, Origin origin = {}) {
  ModuleClass cls;
  cls.name = std::move(name);
  cls.role = Impl::kRoleName;
  cls.factory = [](const BuildContext& ctx) -> std::shared_ptr<PatchableModule> {
    return std::make_shared<Impl>(ctx);
  };
  cls.origin = std::move(origin);
  return cls;
}

}  // namespace torchpatch
