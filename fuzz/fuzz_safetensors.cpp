// The safetensors reader on arbitrary bytes: every header, offset, dtype and shape check, then
// reading each tensor it accepted. Only torchpatch::Error may come out.
#include <cstdint>

#include <ATen/ATen.h>

#include "fuzz_util.h"
#include "torchpatch/checkpoint/safetensors.h"
#include "torchpatch/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fuzz::MemoryFile file(data, size);
  try {
    const auto st = torchpatch::checkpoint::SafetensorsFile::open(file.path());
    for (const auto& info : st->tensors()) {
      const auto tensor = st->tensor(info.name);
      if (tensor.numel() > 0) (void)tensor.reshape(-1)[0].item<double>();  // touch the first and last bytes
      if (tensor.numel() > 1) (void)tensor.reshape(-1)[tensor.numel() - 1].item<double>();
    }
  } catch (const torchpatch::Error&) {
  }
  return 0;
}
