// The devices models run on: the CPU, or a CUDA GPU where LibTorch and torchpatch were built with CUDA.
#pragma once

#include "torchpatch/export.h"

#include <string>

#include <c10/core/Device.h>

namespace torchpatch {

/// "cpu", "cuda" (the first GPU) or "cuda:N"; DeviceError, listing those, for anything else.
TORCHPATCH_API c10::Device parse_device(const std::string& text);

/// Whether this torchpatch was built with its CUDA kernels (TORCHPATCH_CUDA).
TORCHPATCH_API bool cuda_built();

/// Number of CUDA devices this process sees (0 without a driver, a GPU or a CUDA build).
TORCHPATCH_API int cuda_device_count();

/// Throws DeviceError, saying why and what to do instead, unless models can run on `device` here: the
/// CPU always; CUDA device N with a CUDA build, a driver and more than N GPUs.
TORCHPATCH_API void check_device(c10::Device device);

}  // namespace torchpatch
