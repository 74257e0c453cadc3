#include "torchpatch/runtime/loader.h"

#include <algorithm>

#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/patching/scope.h"

namespace torchpatch {

namespace {
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string did_you_mean(const std::string& key, const Registries& registries) {
  std::string best;
  std::size_t best_distance = std::max<std::size_t>(2, key.size() / 3) + 1;
  for (const auto& [name, cls] : registries.classes().all()) {
    const auto d = edit_distance(key, name);
    if (d < best_distance) {
      best = name;
      best_distance = d;
    }
  }
  return best.empty() ? std::string() : fmt::format("did you mean '{}'?", best);
}

std::vector<UnmatchedKey> unmatched_paths(const std::vector<std::string>& patterns, const std::vector<PlanEntry>& plan) {
  std::vector<UnmatchedKey> out;
  for (const auto& pattern : patterns) {
    const bool matched = std::any_of(plan.begin(), plan.end(), [&](const PlanEntry& entry) {
      return PathFilter::first_match({pattern}, entry.path) != nullptr;
    });
    if (matched) continue;
    // The closest last segment of a path ("lm_head" for "lmhead", "q_proj" for "qproj").
    std::string best;
    std::size_t best_distance = std::max<std::size_t>(2, pattern.size() / 3) + 1;
    for (const auto& entry : plan) {
      const auto name = entry.path.substr(entry.path.rfind('.') + 1);
      const auto d = edit_distance(pattern, name);
      if (d < best_distance) {
        best = name;
        best_distance = d;
      }
    }
    out.push_back({pattern, best.empty() ? std::string() : fmt::format("did you mean '{}'?", best)});
  }
  return out;
}

LoadedModel load_model(const ModelSource& source, const LoadModelOptions& options) {
  if (source.checkpoint.has_value() == source.preset.has_value()) {
    throw InputError("model source: give exactly one of a checkpoint directory and a preset");
  }
  LoadedModel loaded;
  const auto& registries = options.pretrained.registries;
  // One scope for the whole build, so it records which keys matched.
  ApplyPatches scope(registries.patches().get_patch_mapping(), registries.patch_tables());
  if (source.preset) {
    loaded.source = "preset " + *source.preset;
    loaded.model = preset_model(*source.preset, source.seed, options.pretrained);
  } else {
    loaded.source = source.checkpoint->string();
    loaded.report.emplace();
    loaded.model = from_pretrained(*source.checkpoint, options.pretrained, &*loaded.report);
  }
  loaded.model->eval();
  for (const auto& point : loaded.model->patch_points()) loaded.plan.push_back({point.path, point.module->patch_record()});
  for (const auto& key : scope.unmatched_keys()) loaded.unmatched.push_back({key, did_you_mean(key, registries)});
  if (options.strict_patches && !loaded.unmatched.empty()) {
    const auto& first = loaded.unmatched.front();
    throw PatchError(fmt::format("--strict: patch key '{}' matched no patch point of {}{}", first.key,
                                 loaded.model->class_name(), first.suggestion.empty() ? "" : "; " + first.suggestion));
  }
  return loaded;
}

}  // namespace torchpatch
