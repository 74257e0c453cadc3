// Patterns, splitting by behaviour, the byte-level table and lossy UTF-8: shared by the stages.
#include <array>

#include <boost/regex/icu.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

#include "text/components.h"
#include "torchpatch/error.h"

namespace torchpatch::text {

void fail(const Source& where, const std::string& cause) {
  throw ConfigError(fmt::format("{}: {}: {}", where.file, where.path, cause));
}

std::string string_field(const nlohmann::json& j, const char* key, const Source& where) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) fail(where, fmt::format("'{}' must be a string", key));
  return it->get<std::string>();
}

bool bool_field(const nlohmann::json& j, const char* key, bool fallback, const Source& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail(where, fmt::format("'{}' must be true or false, not {}", key, it->dump()));
  return it->get<bool>();
}

std::string replace_all(const std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  size_t at = 0;
  for (size_t k = s.find(from); k != std::string::npos; k = s.find(from, at)) {
    out.append(s, at, k - at);
    out += to;
    at = k + from.size();
  }
  out.append(s, at, std::string::npos);
  return out;
}

bool in_unicode_8(char32_t c) {
  UVersionInfo age;
  u_charAge(static_cast<UChar32>(c), age);
  return age[0] != 0 && (age[0] < 8 || (age[0] == 8 && age[1] == 0));
}

std::vector<std::pair<const nlohmann::json*, Source>> sequence_items(const nlohmann::json& j, const char* key,
                                                                     const Source& where) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array()) fail(where, fmt::format("a Sequence needs a '{}' array", key));
  std::vector<std::pair<const nlohmann::json*, Source>> items;
  for (size_t i = 0; i < it->size(); ++i) items.emplace_back(&(*it)[i], where.at(fmt::format("{}[{}]", key, i)));
  return items;
}

// Pattern --------------------------------------------------------------------------------------

struct Pattern::Regex {
  boost::u32regex re;
};

namespace {

// Boost spells Unicode classes differently from Oniguruma (what tokenizers uses): inside brackets
// only [:Name:] works (\p{L} there would be the letters p, {, L, }), and the one-letter general
// categories other than L are not known by that name. Rewrites \p{X} / \P{X} into Boost's forms.
std::string boost_syntax(const std::string& pattern, const Source& where) {
  static const std::pair<const char*, const char*> long_names[] = {{"L", "Letter"},      {"N", "Number"},
                                                                   {"P", "Punctuation"}, {"Z", "Separator"},
                                                                   {"M", "Mark"},        {"S", "Symbol"},
                                                                   {"C", "Other"}};
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      if (e != 'p' && e != 'P') {
        out += pattern.substr(i, 2);
        ++i;
        continue;
      }
      std::string name;
      size_t next = i + 2;
      if (next < pattern.size() && pattern[next] == '{') {
        const size_t close = pattern.find('}', next);
        if (close == std::string::npos) fail(where, fmt::format("regex '{}': unterminated \\{}{{", pattern, e));
        name = pattern.substr(next + 1, close - next - 1);
        next = close + 1;
      } else if (next < pattern.size()) {
        name = pattern.substr(next, 1);
        next += 1;
      }
      for (const auto& [short_name, long_name] : long_names) {
        if (name == short_name) name = long_name;
      }
      if (in_class && e == 'P') fail(where, fmt::format("regex '{}': \\P{{...}} inside brackets is not supported", pattern));
      out += in_class ? "[:" + name + ":]" : (e == 'p' ? "[[:" : "[^[:") + name + ":]]";
      i = next - 1;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A leading ']' or '^]' is a literal in the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t close = pattern.find(":]", i + 2);
      if (close != std::string::npos) {
        out += pattern.substr(i, close + 2 - i);
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

Pattern::Pattern(const nlohmann::json& j, const Source& where) {
  if (j.is_object() && j.contains("String") && j["String"].is_string()) {
    literal_ = j["String"].get<std::string>();
    if (literal_.empty()) fail(where, "an empty String pattern");
  } else if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
    const auto source = j["Regex"].get<std::string>();
    name_ = fmt::format("{}: {}: regex '{}'", where.file, where.path, source);
    const auto translated = boost_syntax(source, where);
    try {
      regex_ = std::make_unique<Regex>(Regex{boost::make_u32regex(translated, boost::regex::perl)});
    } catch (const std::exception& e) {
      fail(where, fmt::format("regex '{}' does not compile: {}", source, e.what()));
    }
  } else {
    fail(where, "a pattern must be {\"String\": ...} or {\"Regex\": ...}");
  }
}

Pattern::~Pattern() = default;
Pattern::Pattern(Pattern&&) noexcept = default;

std::vector<Range> Pattern::find_all(const std::string& text) const {
  std::vector<Range> out;
  if (!regex_) {
    for (size_t at = text.find(literal_); at != std::string::npos; at = text.find(literal_, at + literal_.size())) {
      out.emplace_back(at, at + literal_.size());
    }
    return out;
  }
  const char* begin = text.data();
  try {
    boost::u32regex_iterator<const char*> it(begin, begin + text.size(), regex_->re), end;
    for (; it != end; ++it) {
      const auto& m = (*it)[0];
      if (m.first == m.second) continue;
      out.emplace_back(static_cast<size_t>(m.first - begin), static_cast<size_t>(m.second - begin));
    }
  } catch (const std::runtime_error& e) {  // Boost.Regex's complexity and stack limits
    throw InputError(fmt::format("{} cannot be matched against this text: {}", name_, e.what()));
  }
  return out;
}

// Splitting ------------------------------------------------------------------------------------

SplitBehavior parse_behavior(const nlohmann::json& j, const Source& where) {
  const std::string name = j.is_string() ? j.get<std::string>() : "";
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  fail(where, fmt::format("unsupported split behavior {}", j.dump()));
}

std::vector<Normalized> split_at(const Normalized& piece, const std::vector<Range>& matches, SplitBehavior behavior,
                                 bool invert) {
  // The piece as alternating segments, each marked whether it is a delimiter.
  struct Segment {
    size_t begin, end;
    bool delimiter;
  };
  std::vector<Segment> segments;
  size_t at = 0;
  for (const auto& [b, e] : matches) {
    if (b > at) segments.push_back({at, b, invert});
    segments.push_back({b, e, !invert});
    at = e;
  }
  if (at < piece.text.size()) segments.push_back({at, piece.text.size(), invert});

  std::vector<Range> parts;
  for (size_t i = 0; i < segments.size(); ++i) {
    const auto& s = segments[i];
    switch (behavior) {
      case SplitBehavior::kRemoved:
        if (!s.delimiter) parts.emplace_back(s.begin, s.end);
        break;
      case SplitBehavior::kIsolated: parts.emplace_back(s.begin, s.end); break;
      case SplitBehavior::kContiguous:
        if (s.delimiter && !parts.empty() && i > 0 && segments[i - 1].delimiter) {
          parts.back().second = s.end;
        } else {
          parts.emplace_back(s.begin, s.end);
        }
        break;
      case SplitBehavior::kMergedWithPrevious:
        if (s.delimiter && !parts.empty() && i > 0 && !segments[i - 1].delimiter) {
          parts.back().second = s.end;
        } else {
          parts.emplace_back(s.begin, s.end);
        }
        break;
      case SplitBehavior::kMergedWithNext:
        if (!s.delimiter && !parts.empty() && i > 0 && segments[i - 1].delimiter) {
          parts.back().second = s.end;
        } else {
          parts.emplace_back(s.begin, s.end);
        }
        break;
    }
  }
  std::vector<Normalized> out;
  out.reserve(parts.size());
  for (const auto& [b, e] : parts) {
    if (e > b) out.push_back(piece.slice(b, e));
  }
  return out;
}

// Byte-level table -----------------------------------------------------------------------------

namespace {
struct ByteTable {
  std::array<std::string, 256> chars;
  std::array<int, 512> bytes{};
  ByteTable() {
    bytes.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      append_utf8(chars[b], c);
      bytes[c] = b;
    }
  }
};
const ByteTable& byte_table() {
  static const ByteTable table;
  return table;
}
}  // namespace

const std::string& byte_level_char(unsigned char byte) { return byte_table().chars[byte]; }

int byte_level_byte(char32_t c) { return c < 512 ? byte_table().bytes[c] : -1; }

// Lossy UTF-8 ----------------------------------------------------------------------------------

std::string utf8_lossy(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  for (size_t i = 0; i < s.size();) {
    const unsigned char b0 = byte(i);
    if (b0 < 0x80) {
      out += static_cast<char>(b0);
      ++i;
      continue;
    }
    int len = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // the second byte's valid range
    if (b0 >= 0xc2 && b0 <= 0xdf) {
      len = 2;
    } else if (b0 >= 0xe0 && b0 <= 0xef) {
      len = 3;
      if (b0 == 0xe0) lo = 0xa0;
      if (b0 == 0xed) hi = 0x9f;
    } else if (b0 >= 0xf0 && b0 <= 0xf4) {
      len = 4;
      if (b0 == 0xf0) lo = 0x90;
      if (b0 == 0xf4) hi = 0x8f;
    }
    if (len == 0) {  // not a lead byte
      out += "\xef\xbf\xbd";
      ++i;
      continue;
    }
    size_t k = 1;
    for (; k < static_cast<size_t>(len) && i + k < s.size(); ++k) {
      const unsigned char b = byte(i + k);
      const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xbf);
      if (!ok) break;
    }
    if (k == static_cast<size_t>(len)) {
      out.append(s, i, len);
    } else {
      out += "\xef\xbf\xbd";  // the maximal valid prefix stands for one replacement character
    }
    i += k;
  }
  return out;
}

}  // namespace torchpatch::text
