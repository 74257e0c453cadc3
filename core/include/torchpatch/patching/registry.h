// The patch registry: Hugging Face's `register_patch_mapping` & co., keyed by class name or regular
// expression. An exact key beats a pattern; patterns are searched (unanchored) in registration order
// and the first match wins.
#pragma once

#include "torchpatch/export.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "torchpatch/patching/module_class.h"

namespace torchpatch {

class ClassTable;

/// An ordered mapping from key (class name or pattern) to replacement class, with its patterns
/// compiled. Copies are cheap snapshots; `get_patch_mapping()` returns one.
class TORCHPATCH_API PatchMapping {
 public:
  struct Entry {
    std::string key;
    ModuleClass cls;
  };
  struct Match {
    const Entry* entry = nullptr;
    bool exact = false;
    bool by_kind = false;  ///< matched as a `{kind}` key
    /// "exact key", "kind key '{KIND}'" or "pattern 'KEY'".
    std::string rule() const;
  };
  using Items = std::vector<std::pair<std::string, ModuleClass>>;

  PatchMapping();
  ~PatchMapping();
  PatchMapping(const PatchMapping&);
  PatchMapping& operator=(const PatchMapping&);
  PatchMapping(PatchMapping&&) noexcept;
  PatchMapping& operator=(PatchMapping&&) noexcept;

  /// A mapping made of `items`, validated as `register_patch_mapping` would (throws PatchError).
  /// Roles are checked against `classes` (nullptr: the table in force, active_patch_tables()).
  explicit PatchMapping(const Items& items, bool overwrite = false, const ClassTable* classes = nullptr);

  const std::vector<Entry>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }
  std::size_t size() const { return entries_.size(); }
  bool contains(const std::string& key) const { return get(key) != nullptr; }
  /// The class registered under exactly `key`, or nullptr.
  const ModuleClass* get(const std::string& key) const;

  /// The replacement for `class_name`: an exact key first, then a kind key `{KIND}` naming the patch
  /// point's `kind` (ModuleClass::kind), then the first-registered pattern that `regex_search`es it
  /// (a pattern equal to the name is skipped, as in Python). With a module `path`, entries whose
  /// PathFilter does not admit it are passed over.
  std::optional<Match> find(const std::string& class_name, const std::string& path = {},
                            const std::string& kind = {}) const;

  /// Why entries matching `class_name` were passed over at module `path` by their PathFilter, e.g.
  /// "rule 'Linear' excludes lm_head ('lm_head')"; "" when none was.
  std::string passed_over(const std::string& class_name, const std::string& path, const std::string& kind = {}) const;

  /// Whether `key` is a kind key: `{` lower-case letters, digits and '_' `}`, e.g. "{experts}". Kind
  /// keys are not regular expressions; they match the patch points of that kind in every family.
  static bool is_kind_key(const std::string& key);
  /// The kind key of `kind`: "{experts}".
  static std::string kind_key(const std::string& kind) { return "{" + kind + "}"; }

  /// Adds or replaces entries, all or nothing (see PatchRegistry::register_patch_mapping).
  void insert(const Items& items, bool overwrite, const ClassTable* classes = nullptr);
  /// Removes keys, all or nothing (see PatchRegistry::unregister_patch_mapping).
  void erase(const std::vector<std::string>& keys);
  void clear();

  struct CompiledPattern;  ///< opaque: a compiled regular expression

 private:
  std::vector<Entry> entries_;
  std::vector<std::shared_ptr<const CompiledPattern>> patterns_;  // parallel to entries_
};

/// A thread-safe registry of patch mappings. The process has one global registry (the functions
/// below); hosts and tests may own others.
class TORCHPATCH_API PatchRegistry {
 public:
  /// Keys are checked against the roles in `classes` (nullptr: the table in force when registering).
  explicit PatchRegistry(std::shared_ptr<const ClassTable> classes = nullptr) : classes_(std::move(classes)) {}

  /// Registers `mapping` in order. Per entry: a null factory is an error; an existing key without
  /// `overwrite` is an error ("Class 'K' already has a patch mapping registered. Use overwrite=true
  /// to replace it."); an invalid regular expression is an error; a class whose role differs from a
  /// known patch point named exactly by the key is an error. Any error registers nothing.
  /// With `overwrite`, a replaced key keeps its position.
  void register_patch_mapping(const PatchMapping::Items& mapping, bool overwrite = false);
  /// Removes `keys`; an unknown key is an error and then nothing is removed.
  void unregister_patch_mapping(const std::vector<std::string>& keys);
  void clear_patch_mapping();
  /// A snapshot (copy) of the current mapping.
  PatchMapping get_patch_mapping() const;

  /// Scoped registration (ScopedPatchMapping): `owner`'s entries sit on top of what each key held.
  /// Validated as register_patch_mapping; all or nothing.
  void push_scoped(std::uint64_t owner, const PatchMapping::Items& mapping, bool overwrite);
  /// Takes `owner`'s entries out wherever they sit: a key whose top entry this was gets what lies
  /// below (the entry before the first scoped one, or nothing); a key where a later scope sits above
  /// keeps its value and forgets this layer. A key changed by a plain register or unregister since is
  /// left as that change made it.
  void pop_scoped(std::uint64_t owner);

 private:
  struct Layer {
    std::uint64_t owner;
    ModuleClass cls;
  };
  struct Stack {
    std::optional<ModuleClass> below;  // what the key held before its first scoped entry
    std::vector<Layer> layers;         // oldest first; the last is in force
  };
  std::map<std::string, Stack> scoped_;
  std::shared_ptr<const ClassTable> classes_;
  mutable std::mutex mutex_;
  PatchMapping mapping_;
};

/// The process-wide registry used by `ApplyPatches`, `from_config` and `from_pretrained`.
TORCHPATCH_API PatchRegistry& global_registry();

/// Python-named functions on the global registry.
TORCHPATCH_API void register_patch_mapping(const PatchMapping::Items& mapping, bool overwrite = false);
TORCHPATCH_API void unregister_patch_mapping(const std::vector<std::string>& keys);
TORCHPATCH_API void clear_patch_mapping();
TORCHPATCH_API PatchMapping get_patch_mapping();

/// Registers a mapping for the lifetime of the guard and takes it out again on destruction
/// (exceptions included): the C++ form of `try: register ... finally: clear_patch_mapping()`.
/// With `overwrite`, entries it replaced are put back as they were. Guards on the same key may close
/// in any order (one per thread, say): each restores exactly what it changed (PatchRegistry::pop_scoped).
class TORCHPATCH_API ScopedPatchMapping {
 public:
  explicit ScopedPatchMapping(PatchMapping::Items mapping, bool overwrite = false,
                              PatchRegistry& registry = global_registry());
  ~ScopedPatchMapping();
  ScopedPatchMapping(const ScopedPatchMapping&) = delete;
  ScopedPatchMapping& operator=(const ScopedPatchMapping&) = delete;

 private:
  PatchRegistry& registry_;
  std::uint64_t owner_;
};

}  // namespace torchpatch
