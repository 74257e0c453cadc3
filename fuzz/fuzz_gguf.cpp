// The GGUF reader on arbitrary bytes: every count, string, array, type, dimension, offset and
// alignment check; then each tensor it accepted read and dequantized, the metadata read as a model's
// config by the family of its architecture, and its tokenizer rebuilt. Only torchpatch::Error may
// come out.
#include <cstdint>

#include <ATen/ATen.h>

#include "fuzz_util.h"
#include "torchpatch/checkpoint/gguf.h"
#include "torchpatch/error.h"
#include "torchpatch/models/family.h"
#include "torchpatch/runtime/gguf_model.h"
#include "torchpatch/text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fuzz::MemoryFile file(data, size);
  try {
    const auto gguf = torchpatch::checkpoint::GgufFile::open(file.path());
    for (const auto& info : gguf->tensors()) {
      const auto raw = gguf->raw(info.name);
      if (raw.numel() > 0) (void)raw.reshape(-1)[raw.numel() - 1].item<int64_t>();  // the last byte
      const auto values = gguf->tensor(info.name);
      if (values.numel() > 0) (void)values.reshape(-1)[values.numel() - 1].item<double>();
    }
  } catch (const torchpatch::Error&) {
    return 0;
  }
  try {
    const auto model = torchpatch::read_gguf_model(file.path(), torchpatch::global_families());
    for (const auto& info : model.tensors->tensors()) (void)model.tensors->tensor(info.name);
  } catch (const torchpatch::Error&) {
  }
  try {
    (void)torchpatch::gguf_tokenizer(file.path()).encode("Hello, world 123");
  } catch (const torchpatch::Error&) {
  }
  return 0;
}
