// The families built into libtorchpatch_core: one line each.
#include "torchpatch/models/bert.h"
#include "torchpatch/models/family.h"
#include "torchpatch/models/gemma.h"
#include "torchpatch/models/llama.h"
#include "torchpatch/models/mistral.h"
#include "torchpatch/models/qwen2.h"
#include "torchpatch/models/qwen2_moe.h"
#include "torchpatch/models/qwen3_moe.h"

namespace torchpatch {

void add_builtin_families(FamilyRegistry& families) {
  for (auto family : {llama::family(), mistral::family(), qwen2::family(), qwen2_moe::family(), qwen3_moe::family(),
                      gemma::family(), gemma2::family(), bert::family()}) {
    families.add(std::move(family));
  }
}

FamilyRegistry& global_families() {
  static FamilyRegistry* registry = [] {
    // Never destroyed: plugin families' code outlives static teardown.
    auto* families = new FamilyRegistry(builtin_class_table(), global_recorder_table(), checkpoint::global_conversions());
    add_builtin_families(*families);
    return families;
  }();
  return *registry;
}

namespace {
// The built-in patch points are in the class table from the moment the library is loaded, so a
// registration can check a key's role before any model is built.
[[maybe_unused]] const bool kBuiltinFamiliesRegistered = (global_families(), true);
}  // namespace

}  // namespace torchpatch
