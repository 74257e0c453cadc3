// Pre-tokenizers: Split, ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit, Punctuation,
// BertPreTokenizer, Sequence.
#include <cctype>

#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

#include <fmt/format.h>

#include "text/components.h"

namespace torchpatch::text {

namespace {

// Splits every piece with the ranges `find` returns for it.
template <typename Find>
std::vector<Normalized> split_each(std::vector<Normalized> pieces, const Find& find, SplitBehavior behavior,
                                   bool invert) {
  std::vector<Normalized> out;
  for (const auto& piece : pieces) {
    auto parts = split_at(piece, find(piece.text), behavior, invert);
    for (auto& part : parts) out.push_back(std::move(part));
  }
  return out;
}

// Ranges of maximal runs of code points for which `keep(c)` holds; `each` makes every code point
// its own range instead.
template <typename Keep>
std::vector<Range> runs_where(const std::string& text, const Keep& keep, bool each) {
  std::vector<Range> out;
  for (size_t i = 0; i < text.size();) {
    const size_t start = i;
    const bool hit = keep(next_code_point(text, i));
    if (!hit) continue;
    if (!each && !out.empty() && out.back().second == start) {
      out.back().second = i;
    } else {
      out.emplace_back(start, i);
    }
  }
  return out;
}

class Split : public PreTokenizer {
 public:
  Split(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  std::vector<Normalized> split(std::vector<Normalized> pieces) const override {
    return split_each(std::move(pieces), [&](const std::string& t) { return pattern_.find_all(t); }, behavior_, invert_);
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// GPT-2's split of words, numbers, punctuation and spaces (ByteLevel's use_regex).
const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevel : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex, const Source& where)
      : add_prefix_space_(add_prefix_space),
        regex_(use_regex ? std::make_unique<Pattern>(nlohmann::json{{"Regex", kGpt2Pattern}}, where) : nullptr) {}

  std::vector<Normalized> split(std::vector<Normalized> pieces) const override {
    if (add_prefix_space_) {
      for (auto& piece : pieces) {
        if (piece.text.empty() || piece.text[0] == ' ') continue;
        Normalized spaced;
        spaced.append(" ", {piece.origin.front().first, piece.origin.front().first});
        spaced.append(piece, 0, piece.text.size());
        piece = std::move(spaced);
      }
    }
    if (regex_) {
      pieces = split_each(std::move(pieces), [&](const std::string& t) { return regex_->find_all(t); },
                          SplitBehavior::kIsolated, false);
    }
    for (auto& piece : pieces) {
      Normalized mapped;
      for (size_t i = 0; i < piece.text.size(); ++i) {
        mapped.append(byte_level_char(static_cast<unsigned char>(piece.text[i])), piece.origin[i]);
      }
      piece = std::move(mapped);
    }
    return pieces;
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Pattern> regex_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class Metaspace : public PreTokenizer {
 public:
  Metaspace(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}

  std::vector<Normalized> split(std::vector<Normalized> pieces) const override {
    std::vector<Normalized> out;
    for (size_t p = 0; p < pieces.size(); ++p) {
      auto& piece = pieces[p];
      Normalized replaced = map_code_points(piece, [&](char32_t c, const std::string& bytes) {
        return c == ' ' ? replacement_ : bytes;
      });
      const bool starts = replaced.text.compare(0, replacement_.size(), replacement_) == 0;
      const bool first = !replaced.empty() && replaced.origin.front().first == 0;
      if (!replaced.empty() && !starts &&
          (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && first))) {
        Normalized prefixed;
        prefixed.append(replacement_, {replaced.origin.front().first, replaced.origin.front().first});
        prefixed.append(replaced, 0, replaced.text.size());
        replaced = std::move(prefixed);
      }
      if (!split_) {
        out.push_back(std::move(replaced));
        continue;
      }
      std::vector<Range> at;
      for (size_t k = replaced.text.find(replacement_); k != std::string::npos;
           k = replaced.text.find(replacement_, k + replacement_.size())) {
        at.emplace_back(k, k + replacement_.size());
      }
      for (auto& part : split_at(replaced, at, SplitBehavior::kMergedWithNext, false)) out.push_back(std::move(part));
    }
    return out;
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

// ASCII punctuation (with $+<=>^`|~, symbols to Unicode) or a Unicode punctuation character that
// tokenizers' Unicode 8.0 tables know (in_unicode_8).
bool is_punctuation(char32_t c) {
  if (c < 0x80) return std::ispunct(static_cast<int>(c)) != 0;
  return u_ispunct(static_cast<UChar32>(c)) && in_unicode_8(c);
}

bool is_whitespace(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)) != 0; }

// Splits by a property of single code points (Digits, Punctuation, WhitespaceSplit).
template <typename Keep>
class ByProperty : public PreTokenizer {
 public:
  ByProperty(Keep keep, bool each, SplitBehavior behavior, bool invert)
      : keep_(keep), each_(each), behavior_(behavior), invert_(invert) {}
  std::vector<Normalized> split(std::vector<Normalized> pieces) const override {
    return split_each(std::move(pieces), [&](const std::string& t) { return runs_where(t, keep_, each_); }, behavior_,
                      invert_);
  }

 private:
  Keep keep_;
  bool each_;
  SplitBehavior behavior_;
  bool invert_;
};

template <typename Keep>
std::unique_ptr<PreTokenizer> by_property(Keep keep, bool each, SplitBehavior behavior, bool invert = false) {
  return std::make_unique<ByProperty<Keep>>(keep, each, behavior, invert);
}

class Sequence : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> stages) : stages_(std::move(stages)) {}
  std::vector<Normalized> split(std::vector<Normalized> pieces) const override {
    for (const auto& stage : stages_) pieces = stage->split(std::move(pieces));
    return pieces;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> stages_;
};

PrependScheme prepend_scheme(const nlohmann::json& j, const Source& where) {
  if (j.contains("prepend_scheme")) {
    const auto scheme = string_field(j, "prepend_scheme", where);
    if (scheme == "always") return PrependScheme::kAlways;
    if (scheme == "first") return PrependScheme::kFirst;
    if (scheme == "never") return PrependScheme::kNever;
    fail(where, fmt::format("unsupported prepend_scheme '{}'", scheme));
  }
  return j.value("add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const Source& where) {
  if (!j.is_object()) fail(where, "a pre-tokenizer must be an object");
  const auto type = string_field(j, "type", where);
  if (type == "Split") {
    return std::make_unique<Split>(Pattern(j.value("pattern", nlohmann::json()), where.at("pattern")),
                                   parse_behavior(j.value("behavior", nlohmann::json()), where.at("behavior")),
                                   j.value("invert", false));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevel>(j.value("add_prefix_space", true), j.value("use_regex", true), where);
  if (type == "Metaspace") {
    return std::make_unique<Metaspace>(j.value("replacement", std::string("\xe2\x96\x81")), prepend_scheme(j, where),
                                       j.value("split", true));
  }
  if (type == "Digits") {
    // Each numeric code point (Rust's char::is_numeric: Nd, Nl, No) a match; runs kept together
    // unless individual_digits.
    const auto numeric = [](char32_t c) {
      const auto kind = u_charType(static_cast<UChar32>(c));
      return kind == U_DECIMAL_DIGIT_NUMBER || kind == U_LETTER_NUMBER || kind == U_OTHER_NUMBER;
    };
    return by_property(numeric, true,
                       j.value("individual_digits", false) ? SplitBehavior::kIsolated : SplitBehavior::kContiguous);
  }
  if (type == "Whitespace") {
    // \w+|[^\w\s]+, the matches kept
    return std::make_unique<Split>(Pattern(nlohmann::json{{"Regex", R"(\w+|[^\w\s]+)"}}, where), SplitBehavior::kRemoved,
                                   true);
  }
  if (type == "WhitespaceSplit") return by_property(is_whitespace, true, SplitBehavior::kRemoved);
  if (type == "Punctuation") {
    return by_property(is_punctuation, true, parse_behavior(j.value("behavior", nlohmann::json("Isolated")), where));
  }
  if (type == "BertPreTokenizer") {
    // Words between whitespace, then each punctuation character a word of its own ("don't" is
    // "don", "'", "t").
    std::vector<std::unique_ptr<PreTokenizer>> stages;
    stages.push_back(by_property(is_whitespace, true, SplitBehavior::kRemoved));
    stages.push_back(by_property(is_punctuation, true, SplitBehavior::kIsolated));
    return std::make_unique<Sequence>(std::move(stages));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> stages;
    for (const auto& [item, source] : sequence_items(j, "pretokenizers", where)) stages.push_back(make_pre_tokenizer(*item, source));
    return std::make_unique<Sequence>(std::move(stages));
  }
  fail(where, fmt::format("unsupported pre-tokenizer '{}' (supported: Split, ByteLevel, Metaspace, Digits, Whitespace, "
                          "WhitespaceSplit, Punctuation, BertPreTokenizer, Sequence)",
                          type));
}

}  // namespace torchpatch::text
