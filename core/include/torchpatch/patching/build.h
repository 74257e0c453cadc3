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
}  // namespace detail

/// Builds the module for patch point `key`: the replacement the active ApplyPatches scope maps `key`
/// to, or the built-in class. A replacement of another role is an error naming the key, the mapping
/// entry, both roles and a narrower pattern.
template <typename Role>
std::shared_ptr<Role> build(const std::string& key, const BuildContext& ctx) {
  auto module = detail::build_module(key, Role::kRoleName, ctx);
  auto typed = std::dynamic_pointer_cast<Role>(module);
  if (!typed) {
    throw PatchError("patch point '" + key + "' at " + ctx.path + ": class '" +
                     module->patch_record().class_name + "' declares role " + Role::kRoleName +
                     " but does not derive from it");
  }
  return typed;
}

}  // namespace torchpatch
