// The one door: every patch point is created through `build<Role>(key, ctx)`.
#pragma once

#include "torchpatch/export.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "torchpatch/error.h"
#include "torchpatch/patching/module_class.h"

namespace torchpatch {

/// Built-in classes of every patch point, keyed by Hugging Face class name (a snapshot of the class
/// table in force: active_patch_tables()). The role of a key is the role of its built-in class.
TORCHPATCH_API std::map<std::string, ModuleClass> builtin_classes();

/// Role of a known patch-point key, or "" for an unknown key.
TORCHPATCH_API std::string patch_point_role(const std::string& key);

/// A pattern that matches every key of `wanted_role` but not `key`: ".*SelfAttention$" for a
/// BertSelfAttention replacement that also hit "BertAttention", or the keys spelled out,
/// "^(LlamaAttention|...)$", when no common suffix leaves `key` out. "" when the role has no keys.
TORCHPATCH_API std::string suggest_narrower_pattern(const std::string& key, const std::string& wanted_role);

namespace detail {
TORCHPATCH_API std::shared_ptr<PatchableModule> build_module(const std::string& key, const char* role,
                                              const BuildContext& ctx);
TORCHPATCH_API std::shared_ptr<PatchableModule> build_child_module(const std::string& key, const char* role,
                                                                   const std::string& name, nlohmann::json args);

template <typename Role>
std::shared_ptr<Role> as_role(const std::shared_ptr<PatchableModule>& module, const std::string& key) {
  auto typed = std::dynamic_pointer_cast<Role>(module);
  if (!typed) {
    throw PatchError("patch point '" + key + "' at " + module->patch_record().path + ": class '" +
                     module->patch_record().class_name + "' declares role " + Role::kRoleName +
                     " but does not derive from it");
  }
  return typed;
}
}  // namespace detail

/// Builds the module for patch point `key`: the replacement the active ApplyPatches scope maps `key`
/// to, or the built-in class. A replacement of another role is an error naming the key, the mapping
/// entry, both roles and a narrower pattern.
template <typename Role>
std::shared_ptr<Role> build(const std::string& key, const BuildContext& ctx) {
  return detail::as_role<Role>(detail::build_module(key, Role::kRoleName, ctx), key);
}

/// Builds patch point `key` as child `name` of the module whose factory is running on this thread
/// (its config, layer and path), with constructor arguments `args`: how a block that takes options
/// (nn/) reaches the door for its own parts, such as its projections. Outside any build the child
/// gets an empty config and `name` as its path.
template <typename Role>
std::shared_ptr<Role> build_child(const std::string& key, const std::string& name,
                                  nlohmann::json args = nlohmann::json::object()) {
  return detail::as_role<Role>(detail::build_child_module(key, Role::kRoleName, name, std::move(args)), key);
}

/// While alive on this thread, build_child names its children under submodule `name` of the module
/// being built: for a plain module between a patch point and the parts it builds, such as expert `e`
/// of a list of experts (`experts.3.gate_proj`). Outside a build, `name` becomes the path.
class TORCHPATCH_API BuildSubmodule {
 public:
  explicit BuildSubmodule(const std::string& name);
  ~BuildSubmodule();
  BuildSubmodule(const BuildSubmodule&) = delete;
  BuildSubmodule& operator=(const BuildSubmodule&) = delete;

 private:
  std::unique_ptr<BuildContext> context_;
  const BuildContext* previous_;
};

}  // namespace torchpatch
