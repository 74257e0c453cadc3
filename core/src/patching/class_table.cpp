#include "torchpatch/patching/class_table.h"

#include <fmt/format.h>

#include "torchpatch/error.h"

namespace torchpatch {

void ClassTable::add(const ModuleClass& cls) {
  if (cls.name.empty() || !cls.factory) {
    throw PatchError(fmt::format("built-in class '{}': needs a name and a factory", cls.name));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto why = clash_locked(cls)) throw PatchError(*why);
  classes_.emplace(cls.name, cls);
}

std::optional<std::string> ClassTable::clash(const ModuleClass& cls) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return clash_locked(cls);
}

std::optional<std::string> ClassTable::clash_locked(const ModuleClass& cls) const {
  auto it = classes_.find(cls.name);
  if (it == classes_.end()) return std::nullopt;
  const auto& held = it->second;
  // The same class again (a family registered twice from one place) is no clash.
  if (held.role == cls.role && held.origin.plugin == cls.origin.plugin && held.origin.file == cls.origin.file) {
    return std::nullopt;
  }
  return fmt::format("patch point '{}' is already defined by {} (role {}); {} cannot define it again", cls.name,
                     held.origin.describe(), held.role, cls.origin.describe());
}

std::optional<ModuleClass> ClassTable::find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = classes_.find(key);
  if (it == classes_.end()) return std::nullopt;
  return it->second;
}

std::string ClassTable::role_of(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = classes_.find(key);
  return it == classes_.end() ? std::string() : it->second.role;
}

std::map<std::string, ModuleClass> ClassTable::all() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return classes_;
}

ClassTable& builtin_class_table() {
  static ClassTable table;
  return table;
}

}  // namespace torchpatch
