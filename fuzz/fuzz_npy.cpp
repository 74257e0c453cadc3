// The .npy reader (MoE routes) on arbitrary bytes, then the conversion of what it accepted into
// per-layer routes. Only torchpatch::Error may come out.
#include <cstdint>

#include <ATen/ATen.h>

#include "fuzz_util.h"
#include "torchpatch/error.h"
#include "torchpatch/moe/routing.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fuzz::MemoryFile file(data, size);
  try {
    const auto array = torchpatch::load_npy(file.path());
    (void)torchpatch::routes_from_array(array);
  } catch (const torchpatch::Error&) {
  }
  return 0;
}
