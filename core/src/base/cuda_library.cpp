#include "base/cuda_library.h"

#include <filesystem>
#include <mutex>
#include <string>
#include <typeinfo>

#include <dlfcn.h>

#include <ATen/detail/CUDAHooksInterface.h>

#include "torchpatch/error.h"

namespace torchpatch {
namespace {

double (*cuda_memory_query)(c10::Device) = nullptr;

#if defined(TORCHPATCH_WITH_CUDA)
// libtorchpatch_cuda sits beside libtorchpatch_core, in the build tree and in an installed prefix.
std::filesystem::path cuda_library_path() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(&load_cuda_library), &info) == 0 || info.dli_fname == nullptr) {
    return "libtorchpatch_cuda.so";  // found through the loader's search path, then
  }
  return std::filesystem::path(info.dli_fname).parent_path() / "libtorchpatch_cuda.so";
}

// Empty when the library loaded and LibTorch's CUDA is live; otherwise the error to report.
std::string load_once() {
  const auto path = cuda_library_path();
  // RTLD_GLOBAL: LibTorch's CUDA libraries register their device, allocator and kernels process-wide.
  if (::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* why = ::dlerror();
    return "CUDA: cannot load torchpatch's CUDA library (" + std::string(why ? why : "unknown reason") +
           "); it needs LibTorch's CUDA libraries and the CUDA toolkit's runtime, cuBLAS, cuDNN and NCCL where the "
           "loader finds them (docs/cuda.md), or use --device cpu";
  }
  // LibTorch settles its CUDA hooks once per process, the first time anything asks about CUDA: asked
  // before libtorch_cuda loaded, it keeps its CPU-only answer for good.
  if (typeid(at::detail::getCUDAHooks()) == typeid(at::CUDAHooksInterface)) {
    return "CUDA: LibTorch was asked about CUDA (by at::manual_seed or torch::cuda::is_available, say) before "
           "torchpatch loaded its CUDA library, and keeps its CPU-only answer for the life of the process; call "
           "torchpatch::check_device with the GPU before any other LibTorch call";
  }
  return "";
}
#endif

}  // namespace

void load_cuda_library() {
#if defined(TORCHPATCH_WITH_CUDA)
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [] { failure = load_once(); });
  if (!failure.empty()) throw DeviceError(failure);
#else
  throw DeviceError("CUDA: this torchpatch was built without CUDA (configured with TORCHPATCH_CUDA=OFF, without "
                    "the CUDA toolkit, or its LibTorch has no CUDA); use --device cpu, or build it with CUDA "
                    "(docs/cuda.md)");
#endif
}

void register_cuda_memory_query(double (*query)(c10::Device)) { cuda_memory_query = query; }

double cuda_memory_bytes(c10::Device device) {
  try {
    load_cuda_library();
  } catch (const DeviceError&) {
    return 0;  // unknown: check_device says why
  }
  return cuda_memory_query ? cuda_memory_query(device) : 0;
}

}  // namespace torchpatch
