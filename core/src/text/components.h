// Internal: the stages of a tokenizer.json pipeline, each built from its JSON object.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/normalized.h"

namespace torchpatch::text {

/// Where a component's JSON came from, for error messages: the file and the JSON path.
struct Source {
  std::string file;
  std::string path;
  Source at(const std::string& child) const { return {file, path + "." + child}; }
};

/// Throws ConfigError naming the file, the component's path and the cause.
[[noreturn]] void fail(const Source& where, const std::string& cause);
/// j[key] as a string (throws naming the key when missing or not a string).
std::string string_field(const nlohmann::json& j, const char* key, const Source& where);
/// j[key] as a bool, `fallback` when missing or null (throws naming the key when not a bool).
bool bool_field(const nlohmann::json& j, const char* key, bool fallback, const Source& where);
/// The stages of a Sequence component, j[key] (throws when it is not an array), each with its source.
std::vector<std::pair<const nlohmann::json*, Source>> sequence_items(const nlohmann::json& j, const char* key,
                                                                     const Source& where);

/// Rewrites text before it is split (NFC, Lowercase, Replace, ...).
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual Normalized normalize(Normalized in) const = 0;
};
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const Source& where);

/// Splits text into the pieces the model tokenizes independently.
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  /// pieces -> finer pieces, in order.
  virtual std::vector<Normalized> split(std::vector<Normalized> pieces) const = 0;
};
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const Source& where);

/// A token of one word: its id and the bytes [begin, end) of the word it covers.
struct WordToken {
  int64_t id;
  size_t begin, end;
};

/// Turns one pre-tokenized piece into vocabulary ids (BPE, WordPiece).
class Model {
 public:
  virtual ~Model() = default;
  virtual std::vector<WordToken> tokenize(const std::string& word) const = 0;
  virtual std::optional<int64_t> token_to_id(const std::string& token) const = 0;
  /// The token's string, or nullptr for an id outside the vocabulary.
  virtual const std::string* id_to_token(int64_t id) const = 0;
  virtual int64_t vocab_size() const = 0;
};

/// Turns token strings back into text, in stages (ByteLevel, Replace, ByteFallback, ...).
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual std::vector<std::string> decode_chain(std::vector<std::string> tokens) const = 0;
};
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const Source& where);

/// A search pattern of tokenizer.json: {"String": literal} or {"Regex": Oniguruma-style regex}.
class Pattern {
 public:
  Pattern(const nlohmann::json& j, const Source& where);
  ~Pattern();
  Pattern(Pattern&&) noexcept;
  /// Non-empty, non-overlapping matches in text, left to right. A regex that backtracks without
  /// end on `text` is an InputError naming it.
  std::vector<Range> find_all(const std::string& text) const;

 private:
  struct Regex;
  std::string literal_;
  std::string name_;  ///< file, JSON path and regex, for errors
  std::unique_ptr<Regex> regex_;
};

/// How a split treats the matched part (tokenizers' SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
SplitBehavior parse_behavior(const nlohmann::json& j, const Source& where);
/// Splits `piece` at `matches` (sorted, non-overlapping) as `behavior` says; `invert` swaps the
/// roles of matches and the text between them. Empty pieces are dropped.
std::vector<Normalized> split_at(const Normalized& piece, const std::vector<Range>& matches, SplitBehavior behavior,
                                 bool invert);

/// `s` with every `from` replaced by `to`, left to right.
std::string replace_all(const std::string& s, std::string_view from, std::string_view to);

/// Whether c was assigned a character by Unicode 8.0. tokenizers' Bert components and its
/// Punctuation pre-tokenizer take general categories from the unicode_categories crate, whose
/// tables are Unicode 8.0's: a later punctuation mark, accent or format character is to them an
/// unassigned code point, so ICU's category only counts for characters old enough.
bool in_unicode_8(char32_t c);

/// GPT-2's byte-to-character table: every byte a printable character.
const std::string& byte_level_char(unsigned char byte);
/// The byte a byte-level character stands for, or -1.
int byte_level_byte(char32_t c);

/// s as valid UTF-8, each maximal invalid subsequence replaced by U+FFFD (as Rust's from_utf8_lossy).
std::string utf8_lossy(const std::string& s);

}  // namespace torchpatch::text
