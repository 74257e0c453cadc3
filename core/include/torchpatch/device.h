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
/// CPU always; CUDA device N with a CUDA build, a driver and more than N GPUs. In a CUDA build the first
/// call for a GPU loads torchpatch's CUDA library and LibTorch's (a process that asks for no GPU never
/// loads them). LibTorch settles its answer about CUDA the first time it is asked, so a host that
/// asks LibTorch itself (at::manual_seed, torch::cuda::is_available) calls this first.
TORCHPATCH_API void check_device(c10::Device device);

/// Bytes of memory a model on `device` has: the machine's physical memory for the CPU, the GPU's own
/// for a CUDA device (0 where the system does not say). The size checks made before building a model
/// or a key/value cache compare with it.
TORCHPATCH_API double device_memory_bytes(c10::Device device);

/// Whose memory device_memory_bytes counts, for messages: "this machine's", "GPU cuda:N's" or "the current GPU's".
TORCHPATCH_API std::string device_memory_owner(c10::Device device);

}  // namespace torchpatch
