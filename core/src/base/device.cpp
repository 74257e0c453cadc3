#include "torchpatch/device.h"

#include <algorithm>
#include <cctype>

#include <unistd.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include "base/cuda_library.h"
#include "torchpatch/error.h"
#include "torchpatch/printable.h"

namespace torchpatch {

c10::Device parse_device(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return DeviceError(fmt::format("device '{}': {}; use cpu, cuda or cuda:N (N the GPU's index)",
                                   printable(text, 100), why));
  };
  if (text == "cpu") return c10::Device(c10::kCPU);
  if (text == "cuda") return c10::Device(c10::kCUDA);
  const std::string prefix = "cuda:";
  if (text.rfind(prefix, 0) != 0) throw bad("not a device torchpatch runs models on");
  const auto index = text.substr(prefix.size());
  const bool digits = !index.empty() && index.size() <= 3 &&
                      std::all_of(index.begin(), index.end(), [](unsigned char c) { return std::isdigit(c); });
  if (!digits || std::stoi(index) > 127) throw bad("the GPU's index must be a number from 0 to 127");
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(std::stoi(index)));
}

bool cuda_built() {
#if defined(TORCHPATCH_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
  if (!cuda_built()) return 0;
  // LibTorch's CUDA library registers its device guard when it loads; without a driver it counts 0.
  try {
    load_cuda_library();
  } catch (const DeviceError&) {
    return 0;  // check_device says why
  }
  const auto* impl = c10::impl::hasDeviceGuardImpl(c10::kCUDA) ? c10::impl::getDeviceGuardImpl(c10::kCUDA) : nullptr;
  return impl ? static_cast<int>(impl->deviceCount()) : 0;
}

void check_device(c10::Device device) {
  if (device.is_cpu()) return;
  if (!device.is_cuda()) {
    throw DeviceError(fmt::format("device '{}': torchpatch runs models on cpu or cuda only", device.str()));
  }
  if (!cuda_built()) {
    throw DeviceError(fmt::format("device '{}': this torchpatch was built without CUDA (configured with TORCHPATCH_CUDA=OFF, "
                                  "without the CUDA toolkit, or its LibTorch has no CUDA); use --device cpu, or build "
                                  "it with CUDA (docs/cuda.md)",
                                  device.str()));
  }
  load_cuda_library();  // its reason, where it cannot load
  const int count = cuda_device_count();
  if (count == 0) {
    throw DeviceError(fmt::format("device '{}': this machine has no CUDA GPU (or no NVIDIA driver that LibTorch can "
                                  "use); use --device cpu",
                                  device.str()));
  }
  if (device.has_index() && device.index() >= count) {
    throw DeviceError(fmt::format("device '{}': this machine has {} CUDA GPU{} (cuda:0{}); choose one of them",
                                  device.str(), count, count == 1 ? "" : "s",
                                  count == 1 ? "" : fmt::format(" to cuda:{}", count - 1)));
  }
}

double device_memory_bytes(c10::Device device) {
  if (device.is_cpu()) {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page_size = ::sysconf(_SC_PAGESIZE);
    return pages > 0 && page_size > 0 ? static_cast<double>(pages) * static_cast<double>(page_size) : 0;
  }
  if (device.is_cuda() && cuda_built()) return cuda_memory_bytes(device);
  return 0;
}

std::string device_memory_owner(c10::Device device) {
  if (device.is_cpu()) return "this machine's";
  return device.has_index() ? "GPU " + device.str() + "'s" : "the current GPU's";
}

}  // namespace torchpatch
