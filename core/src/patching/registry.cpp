#include "torchpatch/patching/registry.h"

#include <algorithm>
#include <atomic>
#include <set>

#include <boost/regex.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "base/regex_message.h"

#include "torchpatch/error.h"
#include "torchpatch/printable.h"
#include "torchpatch/patching/build.h"
#include "torchpatch/patching/class_table.h"

namespace torchpatch {

struct PatchMapping::CompiledPattern {
  boost::regex regex;
};

namespace {

std::shared_ptr<const PatchMapping::CompiledPattern> compile_pattern(const std::string& key) {
  try {
    // ECMAScript syntax is what Python's `re` users write; search semantics are applied in find().
    return std::make_shared<const PatchMapping::CompiledPattern>(
        PatchMapping::CompiledPattern{boost::regex(key, boost::regex::ECMAScript)});
  } catch (const boost::regex_error& e) {
    throw PatchError(fmt::format("Invalid regex pattern '{}': {}. Use an exact class name or a valid "
                                 "regular expression.",
                                 key, regex_problem(e)));
  }
}

void validate_entry(const std::string& key, const ModuleClass& cls, const ClassTable* classes) {
  if (key.empty()) throw PatchError("Patch mapping key must not be empty");
  if (!cls.factory) {
    throw PatchError(fmt::format("Replacement for '{}' must be a class, got a null factory{}", key,
                                 cls.name.empty() ? "" : " (class '" + cls.name + "')"));
  }
  if (cls.role.empty()) {
    throw PatchError(fmt::format("Replacement class '{}' for '{}' declares no role", cls.name, key));
  }
  for (const auto* patterns : {&cls.paths.include, &cls.paths.exclude}) {
    for (const auto& pattern : *patterns) {
      if (pattern.empty() || (pattern.find_first_not_of("*.") == std::string::npos && pattern != "*")) {
        throw PatchError(fmt::format("Replacement class '{}' for '{}': module path pattern '{}' names no module",
                                     cls.name, key, printable(pattern)));
      }
    }
  }
  const std::string expected = classes ? classes->role_of(key) : patch_point_role(key);
  if (!expected.empty() && expected != cls.role) {
    throw PatchError(fmt::format(
        "Replacement class '{}' for '{}' has role {}, but '{}' is a patch point of role {}", cls.name,
        key, cls.role, key, expected));
  }
}

}  // namespace

std::string PatchMapping::Match::rule() const {
  return exact ? "exact key" : fmt::format("{} '{}'", by_kind ? "kind key" : "pattern", entry->key);
}

bool PatchMapping::is_kind_key(const std::string& key) {
  if (key.size() < 3 || key.front() != '{' || key.back() != '}') return false;
  return std::all_of(key.begin() + 1, key.end() - 1,
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; });
}

PatchMapping::PatchMapping() = default;
PatchMapping::~PatchMapping() = default;
PatchMapping::PatchMapping(const PatchMapping&) = default;
PatchMapping& PatchMapping::operator=(const PatchMapping&) = default;
PatchMapping::PatchMapping(PatchMapping&&) noexcept = default;
PatchMapping& PatchMapping::operator=(PatchMapping&&) noexcept = default;

PatchMapping::PatchMapping(const Items& items, bool overwrite, const ClassTable* classes) {
  insert(items, overwrite, classes);
}

const ModuleClass* PatchMapping::get(const std::string& key) const {
  for (const auto& entry : entries_) {
    if (entry.key == key) return &entry.cls;
  }
  return nullptr;
}

std::optional<PatchMapping::Match> PatchMapping::find(const std::string& class_name, const std::string& path,
                                                     const std::string& kind) const {
  const auto applies = [&](const Entry& entry) { return path.empty() || entry.cls.paths.admits(path); };
  for (const auto& entry : entries_) {
    if (entry.key == class_name && applies(entry)) return Match{&entry, true};
  }
  if (!kind.empty()) {
    const auto key = kind_key(kind);
    for (const auto& entry : entries_) {
      if (entry.key == key && applies(entry)) return Match{&entry, false, true};
    }
  }
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (!patterns_[i] || entries_[i].key == class_name || !applies(entries_[i])) continue;
    try {
      if (boost::regex_search(class_name, patterns_[i]->regex)) return Match{&entries_[i], false};
    } catch (const std::runtime_error&) {  // Boost gives up on a pattern that backtracks without end
      const auto& origin = entries_[i].cls.origin;
      throw PatchError(fmt::format("patch key '{}'{} is too costly to match against class '{}' (it backtracks "
                                   "without end); simplify the pattern",
                                   printable(entries_[i].key),
                                   origin.builtin() ? "" : " (registered by " + printable(origin.describe()) + ")",
                                   printable(class_name)));
    }
  }
  return std::nullopt;
}

std::string PatchMapping::passed_over(const std::string& class_name, const std::string& path,
                                      const std::string& kind) const {
  std::vector<std::string> reasons;
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const auto& entry = entries_[i];
    if (entry.cls.paths.admits(path)) continue;
    const bool matches = entry.key == class_name || (!kind.empty() && entry.key == kind_key(kind)) ||
                         (patterns_[i] && boost::regex_search(class_name, patterns_[i]->regex));
    if (matches) reasons.push_back(fmt::format("rule '{}' ({}) {}", entry.key, entry.cls.name, entry.cls.paths.why_not(path)));
  }
  return fmt::format("{}", fmt::join(reasons, "; "));
}

void PatchMapping::insert(const Items& items, bool overwrite, const ClassTable* classes) {
  // Validate everything against a working copy first: all or nothing.
  std::vector<Entry> entries = entries_;
  auto patterns = patterns_;
  for (const auto& item : items) {
    const std::string& key = item.first;  // not a structured binding: the lambda below captures it
    const ModuleClass& cls = item.second;
    validate_entry(key, cls, classes);
    auto compiled = is_kind_key(key) ? nullptr : compile_pattern(key);
    auto it = std::find_if(entries.begin(), entries.end(), [&](const Entry& e) { return e.key == key; });
    if (it != entries.end()) {
      if (!overwrite) {
        throw PatchError(fmt::format("Class '{}' already has a patch mapping registered{}. Use "
                                     "overwrite=true to replace it.",
                                     key,
                                     it->cls.origin.builtin() ? "" : " by " + it->cls.origin.describe()));
      }
      it->cls = cls;  // keeps its position, as a Python dict does
    } else {
      entries.push_back({key, cls});
      patterns.push_back(std::move(compiled));
    }
  }
  entries_ = std::move(entries);
  patterns_ = std::move(patterns);
}

void PatchMapping::erase(const std::vector<std::string>& keys) {
  std::set<std::string> doomed;
  for (const auto& key : keys) {
    if (!contains(key)) {
      throw PatchError(fmt::format("Class or pattern '{}' not found in monkey patch mapping cache. "
                                   "Cannot unregister a class that is not registered.",
                                   key));
    }
    doomed.insert(key);
  }
  std::vector<Entry> entries;
  std::vector<std::shared_ptr<const CompiledPattern>> patterns;
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (doomed.count(entries_[i].key)) continue;
    entries.push_back(std::move(entries_[i]));
    patterns.push_back(std::move(patterns_[i]));
  }
  entries_ = std::move(entries);
  patterns_ = std::move(patterns);
}

void PatchMapping::clear() {
  entries_.clear();
  patterns_.clear();
}

void PatchRegistry::register_patch_mapping(const PatchMapping::Items& mapping, bool overwrite) {
  std::lock_guard<std::mutex> lock(mutex_);
  mapping_.insert(mapping, overwrite, classes_.get());
  for (const auto& item : mapping) scoped_.erase(item.first);  // the plain registration wins over scopes
}

void PatchRegistry::unregister_patch_mapping(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  mapping_.erase(keys);
  for (const auto& key : keys) scoped_.erase(key);
}

void PatchRegistry::clear_patch_mapping() {
  std::lock_guard<std::mutex> lock(mutex_);
  mapping_.clear();
  scoped_.clear();
}

PatchMapping PatchRegistry::get_patch_mapping() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return mapping_;
}

PatchRegistry& global_registry() {
  static PatchRegistry registry;
  return registry;
}

void register_patch_mapping(const PatchMapping::Items& mapping, bool overwrite) {
  global_registry().register_patch_mapping(mapping, overwrite);
}
void unregister_patch_mapping(const std::vector<std::string>& keys) {
  global_registry().unregister_patch_mapping(keys);
}
void clear_patch_mapping() { global_registry().clear_patch_mapping(); }
PatchMapping get_patch_mapping() { return global_registry().get_patch_mapping(); }

void PatchRegistry::push_scoped(std::uint64_t owner, const PatchMapping::Items& mapping, bool overwrite) {
  std::lock_guard<std::mutex> lock(mutex_);
  const PatchMapping before = mapping_;
  mapping_.insert(mapping, overwrite, classes_.get());  // validates; throws before anything changed
  for (const auto& [key, cls] : mapping) {
    auto [it, fresh] = scoped_.try_emplace(key);
    if (fresh) {
      if (const ModuleClass* held = before.get(key)) it->second.below = *held;
    }
    it->second.layers.push_back({owner, cls});
  }
}

void PatchRegistry::pop_scoped(std::uint64_t owner) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = scoped_.begin(); it != scoped_.end();) {
    auto& layers = it->second.layers;
    const auto mine = std::find_if(layers.begin(), layers.end(), [&](const Layer& l) { return l.owner == owner; });
    if (mine == layers.end()) {
      ++it;
      continue;
    }
    const bool on_top = mine + 1 == layers.end();
    layers.erase(mine);
    if (on_top) {
      const std::optional<ModuleClass> next = layers.empty() ? it->second.below : layers.back().cls;
      if (next) {
        mapping_.insert({{it->first, *next}}, /*overwrite=*/true, classes_.get());
      } else if (mapping_.contains(it->first)) {
        mapping_.erase({it->first});
      }
    }
    it = layers.empty() ? scoped_.erase(it) : std::next(it);
  }
}

namespace {
std::atomic<std::uint64_t> next_scope_owner{1};
}  // namespace

ScopedPatchMapping::ScopedPatchMapping(PatchMapping::Items mapping, bool overwrite, PatchRegistry& registry)
    : registry_(registry), owner_(next_scope_owner++) {
  registry_.push_scoped(owner_, mapping, overwrite);
}

ScopedPatchMapping::~ScopedPatchMapping() {
  try {
    registry_.pop_scoped(owner_);
  } catch (...) {
    // A destructor must not throw; nothing in pop_scoped is expected to.
  }
}

}  // namespace torchpatch
