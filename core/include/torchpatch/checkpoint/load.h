// Loading checkpoint tensors into a model's parameters.
#pragma once

#include "torchpatch/export.h"

#include <filesystem>
#include <memory>
#include <vector>

#include "torchpatch/checkpoint/safetensors.h"
#include "torchpatch/models/pretrained.h"

namespace torchpatch::checkpoint {

/// Copies every parameter of `model` from `files` (converting dtype). Strict: a missing tensor (other
/// than a tied alias), a shape mismatch or an unexpected tensor is a CheckpointError naming the file
/// and the tensor.
TORCHPATCH_API void load_weights(PretrainedModel& model, const std::vector<std::shared_ptr<SafetensorsFile>>& files);

}  // namespace torchpatch::checkpoint
