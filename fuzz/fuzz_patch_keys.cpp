// Patch keys (class names or regular expressions) from the first lines, class names to look up
// from the rest: registration validates every key; lookup finds an entry or nothing. Only
// torchpatch::Error may come out (a pattern too costly to match is one).
#include <cstdint>
#include <cstdlib>

#include "fuzz_util.h"
#include "torchpatch/error.h"
#include "torchpatch/models/llama.h"
#include "torchpatch/patching/module_class.h"
#include "torchpatch/patching/registry.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto cls = torchpatch::module_class<torchpatch::llama::LlamaMLP>("FuzzMLP");
  const auto lines = fuzz::lines(data, size);
  const std::size_t keys = std::min<std::size_t>(lines.size(), 4);
  torchpatch::PatchRegistry registry;
  try {
    torchpatch::PatchMapping::Items items;
    for (std::size_t i = 0; i < keys; ++i) items.emplace_back(lines[i], cls);
    registry.register_patch_mapping(items, /*overwrite=*/true);
  } catch (const torchpatch::Error&) {
    return 0;
  }
  const auto mapping = registry.get_patch_mapping();
  try {
    for (std::size_t i = keys; i < lines.size(); ++i) {
      if (const auto match = mapping.find(lines[i]); match && !match->entry) std::abort();
    }
    for (const char* name : {"LlamaMLP", "LlamaAttention", "Qwen2MoeSparseMoeBlock", ""}) (void)mapping.find(name);
  } catch (const torchpatch::Error&) {
  }
  return 0;
}
