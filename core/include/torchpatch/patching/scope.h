// `ApplyPatches`: while one is open on a thread, models built on that thread use the replacements.
#pragma once

#include "torchpatch/export.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "torchpatch/patching/registry.h"

namespace torchpatch {

class ClassTable;
class RecorderTable;

/// The tables a build consults besides the mapping: built-in classes (the fallback of every patch
/// point) and output recorders (kept by the models built, for their captures).
struct TORCHPATCH_API PatchTables {
  std::shared_ptr<const ClassTable> classes;
  std::shared_ptr<const RecorderTable> recorders;
  /// The process-wide tables.
  static PatchTables global();
};

/// RAII form of Python's `with apply_patches():`. Takes a snapshot of the global registry (or uses
/// the mapping given) when opened; closes on destruction, exceptions included. Scopes are per
/// thread and nest (the innermost wins), so two threads can build differently patched models at the
/// same time. Close a scope on the thread that opened it. Without tables given, a scope uses those
/// of the scope around it, or the process-wide ones.
class TORCHPATCH_API ApplyPatches {
 public:
  ApplyPatches();
  explicit ApplyPatches(PatchMapping mapping);
  ApplyPatches(PatchMapping mapping, PatchTables tables);
  ~ApplyPatches();
  ApplyPatches(const ApplyPatches&) = delete;
  ApplyPatches& operator=(const ApplyPatches&) = delete;

  const PatchMapping& mapping() const;
  /// Keys of the mapping no patch point matched while this scope was open, in registration order.
  std::vector<std::string> unmatched_keys() const;

  struct State;  // shared with the build path

 private:
  std::shared_ptr<State> state_;
};

namespace detail {
/// The innermost open scope on this thread, or nullptr.
TORCHPATCH_API ApplyPatches::State* active_patch_scope();
}  // namespace detail

/// The tables in force on this thread: the innermost scope's, or the process-wide ones.
TORCHPATCH_API PatchTables active_patch_tables();

/// The mapping in force on this thread (nullptr outside any ApplyPatches).
TORCHPATCH_API const PatchMapping* active_patch_mapping();

}  // namespace torchpatch
