// Everything a model is built from, in one object: the patches, the built-in classes, the output
// recorders, the weight conversions and the families. The process-wide instance is what the free
// functions (register_patch_mapping, register_output_recorder, ...) use; one made with `Registries()`
// shares nothing with it, so two hosts in one process hold their own plugins and patches.
#pragma once

#include "torchpatch/export.h"

#include <memory>

#include "torchpatch/checkpoint/conversion.h"
#include "torchpatch/models/family.h"
#include "torchpatch/patching/class_table.h"
#include "torchpatch/patching/outputs.h"
#include "torchpatch/patching/registry.h"
#include "torchpatch/patching/scope.h"

namespace torchpatch {

/// A handle: copies share the same tables (that is how two hosts share state when they want to).
class TORCHPATCH_API Registries {
 public:
  /// Tables of their own holding the built-in families (their classes, recorders and conversions)
  /// and no patches.
  Registries();

  PatchRegistry& patches() const;
  ClassTable& classes() const;
  RecorderTable& recorders() const;
  checkpoint::ConversionRegistry& conversions() const;
  FamilyRegistry& families() const;

  /// A handle sharing everything with this one but the patches, which start empty: a host that
  /// chooses its own replacements among the same families, conversions and loaded plugins.
  Registries with_own_patches() const;

  /// What an ApplyPatches scope over these registries consults besides the mapping.
  PatchTables patch_tables() const;

  bool operator==(const Registries& other) const { return tables_ == other.tables_; }
  bool operator!=(const Registries& other) const { return tables_ != other.tables_; }

  struct Tables;

 private:
  explicit Registries(std::shared_ptr<Tables> tables) : tables_(std::move(tables)) {}
  friend TORCHPATCH_API const Registries& default_registries();
  std::shared_ptr<Tables> tables_;
};

/// The process-wide registries: global_registry(), builtin_class_table(), global_recorder_table(),
/// checkpoint::global_conversions() and global_families().
TORCHPATCH_API const Registries& default_registries();

}  // namespace torchpatch
