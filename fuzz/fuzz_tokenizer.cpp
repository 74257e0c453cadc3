// Tokenizers on arbitrary bytes. The first byte picks what the rest is:
//   0      a tokenizer.json (read, then used on a short text);
//   1..3   a text encoded by Llama-2's, Llama-3's or Qwen3's real tokenizer, then decoded back
//          whole and streamed: the two must agree, except with Llama-3's clean-up of spaces,
//          whose overlapping rewrites (" ' ' m") a stream cannot always follow;
//   other  token ids (two bytes each, some out of range) decoded by the three, whole and streamed.
// Only torchpatch::Error may come out.
#include <array>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "torchpatch/error.h"
#include "torchpatch/text/tokenizer.h"

using torchpatch::text::IncrementalDecoder;
using torchpatch::text::Tokenizer;

namespace {

const std::array<Tokenizer, 3>& real_tokenizers() {
  static const std::array<Tokenizer, 3> tokenizers{Tokenizer::from_pretrained(TORCHPATCH_TOKENIZER_DIR "/llama2"),
                                                   Tokenizer::from_pretrained(TORCHPATCH_TOKENIZER_DIR "/llama3"),
                                                   Tokenizer::from_pretrained(TORCHPATCH_TOKENIZER_DIR "/qwen3")};
  return tokenizers;
}

std::string streamed(const Tokenizer& tokenizer, const std::vector<int64_t>& ids) {
  IncrementalDecoder stream(tokenizer);
  std::string text;
  for (const auto id : ids) text += stream.push(id);
  return text + stream.finish();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  ++data, --size;
  try {
    if (mode == 0) {
      const fuzz::MemoryFile file(data, size);
      const auto tokenizer = Tokenizer::from_file(file.path());
      const auto e = tokenizer.encode("Hello w\xc3\xb6rld 123 <s> \xe2\x96\x81x");
      (void)tokenizer.decode(e.ids);
      return 0;
    }
    if (mode <= 3) {
      const auto& tokenizer = real_tokenizers()[mode - 1];
      const std::string text(reinterpret_cast<const char*>(data), size);
      const auto ids = tokenizer.encode(text).ids;
      const bool cleans_up = tokenizer.cleans_up_spaces();
      if (tokenizer.decode(ids) != streamed(tokenizer, ids) && !cleans_up) std::abort();
      return 0;
    }
    std::vector<int64_t> ids;
    for (std::size_t i = 0; i + 1 < size; i += 2) ids.push_back(data[i] | (data[i + 1] << 8) | ((mode & 1) << 16));
    for (const auto& tokenizer : real_tokenizers()) {
      (void)tokenizer.decode(ids, mode & 2);
      (void)streamed(tokenizer, ids);
    }
  } catch (const torchpatch::Error&) {
  }
  return 0;
}
