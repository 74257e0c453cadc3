// Internal: torchpatch's CUDA code lives in its own library, libtorchpatch_cuda, beside
// libtorchpatch_core. It links LibTorch's CUDA libraries (and through them cuBLAS, cuDNN, NCCL: most of
// a second of start-up and about 450 MB), so a process loads it only when it first asks for a GPU.
// When it loads, its static initializers hand what it provides to the layer that uses it
// (register_cuda_memory_query here, nn/quant_device.h, generation/static_decode.h): each layer keeps
// its own entry points, and none of them reaches up.
#pragma once

#include <c10/core/Device.h>

namespace torchpatch {

/// Loads libtorchpatch_cuda once per process (later calls return at once). DeviceError where this
/// torchpatch was built without CUDA, where the library or LibTorch's CUDA libraries cannot be loaded
/// (the message carries the loader's reason), or where LibTorch settled its CUDA hooks before (its
/// first question about CUDA fixes them for the process).
void load_cuda_library();

/// Bytes of memory CUDA device `device` has (0 if unknown); loads libtorchpatch_cuda first.
double cuda_memory_bytes(c10::Device device);

/// Called by libtorchpatch_cuda as it loads: how many bytes of memory a CUDA device has (0 if unknown).
void register_cuda_memory_query(double (*query)(c10::Device));

}  // namespace torchpatch
