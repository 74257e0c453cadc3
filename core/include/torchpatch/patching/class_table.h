// The built-in class of every patch point, by key. The patching layer knows no family: families fill
// this table when they are registered (models/family.h), and a patch point's role is its built-in
// class's role.
#pragma once

#include "torchpatch/export.h"

#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "torchpatch/patching/module_class.h"

namespace torchpatch {

/// A thread-safe table of built-in patch-point classes keyed by Hugging Face class name.
class TORCHPATCH_API ClassTable {
 public:
  /// Adds `cls` under its name. The same name twice is a PatchError naming both origins, unless the
  /// class is the one already there (same origin and role).
  void add(const ModuleClass& cls);
  /// Why `cls` cannot be added ("patch point 'X' is already defined by ..."), or nullopt.
  std::optional<std::string> clash(const ModuleClass& cls) const;
  /// The class under `key`, or nullopt.
  std::optional<ModuleClass> find(const std::string& key) const;
  /// Role of `key`'s class, or "" for an unknown key.
  std::string role_of(const std::string& key) const;
  /// A snapshot of every class by key.
  std::map<std::string, ModuleClass> all() const;

 private:
  std::optional<std::string> clash_locked(const ModuleClass& cls) const;
  mutable std::mutex mutex_;
  std::map<std::string, ModuleClass> classes_;
};

/// The process-wide table `build<>` falls back to (built-in families and plugin families are in it).
TORCHPATCH_API ClassTable& builtin_class_table();

}  // namespace torchpatch
