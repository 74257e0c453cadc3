// Loading a model the way the CLI does, for any host: from a checkpoint directory or a preset, with
// the registered patches applied, and everything a user wants to know about it: the loading report,
// the plan (what each patch point became and why) and the registered keys that matched nothing,
// each with a "did you mean" suggestion. With strict patches such a key is an error.
#pragma once

#include "torchpatch/export.h"

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "torchpatch/checkpoint/load.h"
#include "torchpatch/models/pretrained.h"
#include "torchpatch/runtime/auto.h"

namespace torchpatch {

/// Where a model comes from: exactly one of a checkpoint directory and a preset name.
struct TORCHPATCH_API ModelSource {
  std::optional<std::filesystem::path> checkpoint;
  std::optional<std::string> preset;
  uint64_t seed = 0;  ///< a preset's random weights
};

struct TORCHPATCH_API LoadModelOptions {
  PretrainedOptions pretrained;  ///< dtype, strict weights, config overrides, the registries to use
  /// A registered patch key that matched no patch point is a PatchError (with its suggestion).
  bool strict_patches = false;
};

/// One patch point of the plan.
struct TORCHPATCH_API PlanEntry {
  std::string path;        ///< "model.layers.0.self_attn"
  PatchRecord record;      ///< key, class built, rule, origin
};

/// A registered key no patch point matched, and the known key closest to it ("" when none is close).
struct TORCHPATCH_API UnmatchedKey {
  std::string key;
  std::string suggestion;  ///< e.g. "did you mean 'LlamaAttention'?"
};

struct TORCHPATCH_API LoadedModel {
  std::shared_ptr<PretrainedModel> model;        ///< in eval mode
  std::string source;                            ///< "preset NAME" or the checkpoint directory
  std::optional<checkpoint::LoadReport> report;  ///< how the checkpoint loaded (checkpoints only)
  std::vector<PlanEntry> plan;                   ///< every patch point, in module-tree order
  std::vector<UnmatchedKey> unmatched;           ///< registered keys that matched nothing
};

/// Builds the model of `source` inside one ApplyPatches scope of the patches registered in
/// `options.pretrained.registries` and reports
/// on it. Throws ConfigError / CheckpointError / PatchError naming the fault; InputError when the
/// source is not exactly one of checkpoint and preset.
TORCHPATCH_API LoadedModel load_model(const ModelSource& source, const LoadModelOptions& options = {});

/// "did you mean 'LlamaAttention'?" for a key close to a known patch point ("" when none is close).
TORCHPATCH_API std::string did_you_mean(const std::string& key, const Registries& registries = default_registries());

/// The module-path patterns of `patterns` (PathFilter's rule: the whole path or a dotted suffix, `*`
/// and `?` globs) that match no patch point of `plan`, each with the closest module name as its
/// suggestion: how a mistyped `modules_to_not_convert` / --keep-float pattern shows.
TORCHPATCH_API std::vector<UnmatchedKey> unmatched_paths(const std::vector<std::string>& patterns,
                                                         const std::vector<PlanEntry>& plan);

}  // namespace torchpatch
