// The families built into libtorchpatch_core: one line each.
#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/models/bert.h"
#include "torchpatch/models/family.h"
#include "torchpatch/models/gemma.h"
#include "torchpatch/models/llama.h"
#include "torchpatch/models/mistral.h"
#include "torchpatch/models/qwen2.h"
#include "torchpatch/models/qwen2_moe.h"
#include "torchpatch/models/qwen3.h"
#include "torchpatch/models/qwen3_moe.h"
#include "torchpatch/nn/linear.h"

namespace torchpatch {

// Families in one file each, with nothing of their own to export.
namespace mixtral { Family family(); }
namespace smollm3 { Family family(); }
namespace granite { Family family(); }
namespace olmo2 { Family family(); }
namespace olmoe { Family family(); }
namespace glm4_moe { Family family(); }
namespace deepseek_v3 { Family family(); }
namespace gpt_oss { Family family(); }

namespace {

// nn::Linear as the "Linear" patch point, from the constructor arguments nn::make_linear passes.
ModuleClass linear_class() {
  ModuleClass cls;
  cls.name = "Linear";
  cls.role = roles::Linear::kRoleName;
  cls.factory = [](const BuildContext& ctx) -> std::shared_ptr<PatchableModule> {
    const int64_t in = ctx.arg("in_features", -1), out = ctx.arg("out_features", -1);
    if (in < 0 || out < 0) {
      throw PatchError(fmt::format("Linear at {}: needs in_features and out_features, got {}", ctx.path, ctx.args.dump()));
    }
    return std::make_shared<nn::Linear>(in, out, ctx.flag("bias", false));
  };
  return cls;
}

}  // namespace

void add_builtin_families(FamilyRegistry& families) {
  families.add_shared_patch_point(linear_class());
  for (auto family : {llama::family(), mistral::family(), qwen2::family(), qwen2_moe::family(), qwen3::family(),
                      qwen3_moe::family(), gemma::family(), gemma2::family(), gemma3::family(), mixtral::family(), smollm3::family(),
                      granite::family(), olmo2::family(), olmoe::family(), glm4_moe::family(), deepseek_v3::family(),
                      gpt_oss::family(), bert::family()}) {
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
