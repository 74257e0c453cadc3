#include "torchpatch/checkpoint/load.h"

#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "torchpatch/error.h"

namespace torchpatch::checkpoint {

namespace {
bool ignored_on_load(const std::string& name) {
  // Old checkpoints store the rotary tables, which are computed, not loaded.
  const std::string suffix = "rotary_emb.inv_freq";
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

void load_weights(PretrainedModel& model, const std::vector<std::shared_ptr<SafetensorsFile>>& files) {
  std::map<std::string, const SafetensorsFile*> where;
  for (const auto& file : files) {
    for (const auto& info : file->tensors()) where.emplace(info.name, file.get());
  }
  const auto tied = model.tied_weights();
  const std::string sources = files.size() == 1 ? files.front()->path().string() : fmt::format("{} files", files.size());
  std::set<std::string> used;
  at::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    auto found = where.find(name);
    if (found == where.end()) {
      if (tied.count(name)) continue;  // shares its tensor with the key it is tied to
      throw CheckpointError(fmt::format("{}: missing tensor '{}' needed by {}", sources, name, model.class_name()));
    }
    const SafetensorsFile& file = *found->second;
    const TensorInfo& info = *file.find(name);
    auto& param = item.value();
    if (at::IntArrayRef(info.shape) != param.sizes()) {
      throw CheckpointError(fmt::format("{}: tensor '{}' has shape [{}] but {} expects [{}]", file.path().string(),
                                        name, fmt::join(info.shape, ", "), model.class_name(),
                                        fmt::join(param.sizes(), ", ")));
    }
    param.copy_(file.tensor(name));
    used.insert(name);
  }
  for (const auto& [name, file] : where) {
    if (!used.count(name) && !ignored_on_load(name)) {
      throw CheckpointError(fmt::format("{}: unexpected tensor '{}' (no such parameter in {})", file->path().string(),
                                        name, model.class_name()));
    }
  }
}

}  // namespace torchpatch::checkpoint
