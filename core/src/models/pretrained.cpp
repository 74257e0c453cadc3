#include "torchpatch/models/pretrained.h"

#include <optional>

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

namespace {
// The first parameter in parameters()' order (a module's own, then its children's), found without
// listing them all: forward asks on every step.
std::optional<c10::Device> first_parameter_device(const torch::nn::Module& module) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) return item.value().device();
  for (const auto& child : module.children()) {
    if (const auto device = first_parameter_device(*child)) return device;
  }
  return std::nullopt;
}

void move_to(at::Tensor& t, c10::Device device) {
  if (t.defined() && t.device() != device) t = t.to(device);
}
}  // namespace

c10::Device PretrainedModel::device() const {
  return first_parameter_device(*this).value_or(c10::Device(c10::kCPU));
}

ModelOutput on_host(ModelOutput out) {
  const c10::Device cpu(c10::kCPU);
  for (auto* t : {&out.logits, &out.last_hidden_state, &out.pooler_output, &out.loss, &out.aux_loss}) move_to(*t, cpu);
  for (auto& t : out.hidden_states) move_to(t, cpu);
  for (auto& [name, tensors] : out.captured) {
    for (auto& t : tensors) move_to(t, cpu);
  }
  return out;
}

ModelOutput PretrainedModel::forward(const ModelInputs& given) {
  // Inputs come from the host (files, tokenizers) or from the model's own device (generation).
  const auto device = this->device();
  ModelInputs moved;
  const bool move = !device.is_cpu();
  if (move) {
    moved = given;
    for (auto* t : {&moved.input_ids, &moved.attention_mask, &moved.position_ids, &moved.token_type_ids,
                    &moved.encoder_hidden_states, &moved.encoder_attention_mask, &moved.labels}) {
      move_to(*t, device);
    }
  }
  const ModelInputs& inputs = move ? moved : given;
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
