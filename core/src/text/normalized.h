// Internal: a piece of text as the tokenizer pipeline transforms it, each byte remembering which
// bytes of the original input it came from (so tokens report offsets into what the user passed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace torchpatch::text {

/// [begin, end) byte range in the original input.
using Range = std::pair<size_t, size_t>;

/// Decodes the code point at s[i] (advancing i); invalid bytes decode as U+FFFD, one byte each.
char32_t next_code_point(const std::string& s, size_t& i);
/// Appends c as UTF-8.
void append_utf8(std::string& out, char32_t c);
/// The offset of the first byte of s that is not well-formed UTF-8, or std::string::npos.
size_t invalid_utf8_at(const std::string& s);
/// Whether s is well-formed UTF-8.
inline bool valid_utf8(const std::string& s) { return invalid_utf8_at(s) == std::string::npos; }

struct Normalized {
  std::string text;
  std::vector<Range> origin;  ///< per byte of text

  /// The original text s, whose bytes start at `offset` in the input.
  static Normalized original(const std::string& s, size_t offset);

  /// The original range bytes [begin, end) of text came from.
  Range origin_of(size_t begin, size_t end) const;
  /// Bytes [begin, end) of this piece, alignments kept.
  Normalized slice(size_t begin, size_t end) const;

  /// Appends `piece` whose every byte comes from `from`.
  void append(const std::string& piece, Range from);
  /// Appends bytes [begin, end) of other with their alignments.
  void append(const Normalized& other, size_t begin, size_t end);
  bool empty() const { return text.empty(); }
};

/// Rewrites every code point with `map` (the code point, its UTF-8 bytes) -> replacement text, each
/// replacement aligned to the code point it replaces.
template <typename Map>
Normalized map_code_points(const Normalized& in, const Map& map) {
  Normalized out;
  out.text.reserve(in.text.size());
  out.origin.reserve(in.text.size());
  for (size_t i = 0; i < in.text.size();) {
    const size_t start = i;
    const char32_t c = next_code_point(in.text, i);
    out.append(map(c, in.text.substr(start, i - start)), in.origin_of(start, i));
  }
  return out;
}

}  // namespace torchpatch::text
