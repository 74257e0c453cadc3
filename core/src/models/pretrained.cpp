#include "torchpatch/models/pretrained.h"

#include "torchpatch/patching/outputs.h"
#include "torchpatch/patching/scope.h"

namespace torchpatch {

PretrainedModel::PretrainedModel(ModelConfig config, std::string class_name)
    : config_(std::move(config)), class_name_(std::move(class_name)), recorders_(active_patch_tables().recorders) {}

PretrainedModel::~PretrainedModel() = default;

std::vector<PatchPoint> PretrainedModel::patch_points() const {
  std::vector<PatchPoint> points;
  for (const auto& item : named_modules("", /*include_self=*/false)) {
    auto module = std::dynamic_pointer_cast<PatchableModule>(item.value());
    if (module && module->patch_record().built()) {
      points.push_back({item.key(), std::move(module)});
    }
  }
  return points;
}

ModelOutput PretrainedModel::forward(const ModelInputs& inputs) {
  auto names = inputs.outputs;
  required_outputs(inputs, names);
  if (names.empty()) {
    auto out = forward_impl(inputs);
    complete(inputs, out);
    return out;
  }
  CaptureOutputs capture(class_name(), names, *recorders_);  // recorders are looked up by this class, the outer one
  ModelInputs inner = inputs;
  inner.outputs.clear();
  auto out = forward_impl(inner);
  out.captured = capture.take();
  complete(inputs, out);
  return out;
}

}  // namespace torchpatch
