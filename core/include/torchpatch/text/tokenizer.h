// Hugging Face tokenizer.json in C++: text to token ids and back, as the `tokenizers` library does.
#pragma once

#include "torchpatch/export.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace torchpatch::text {

/// One encoded text.
struct TORCHPATCH_API Encoding {
  std::vector<int64_t> ids;
  std::vector<std::string> tokens;                    ///< the vocabulary's strings
  std::vector<std::pair<size_t, size_t>> offsets;     ///< byte range of each token in the input
  std::vector<uint8_t> special_tokens_mask;           ///< 1 where the post-processor added the token
};

/// Which end of its row encode_padded puts the padding at (transformers' padding_side).
enum class PaddingSide {
  kLeft,   ///< decoders, for generation: every row continues from its last column
  kRight,  ///< encoders such as BERT: every row's positions start at 0
};

/// A batch padded to its longest row: ids [B, L] and attention_mask [B, L] (0 at padding), row-major.
struct TORCHPATCH_API PaddedBatch {
  int64_t rows = 0, length = 0;
  std::vector<int64_t> ids;
  std::vector<int64_t> attention_mask;
};

/// tokenizer.json (+ tokenizer_config.json) as Hugging Face's tokenizers runs it: added tokens,
/// normalizer, pre-tokenizer, model (BPE or WordPiece), post-processor, decoder. An unsupported
/// component is a ConfigError naming it and the file. Encoding input that is not valid UTF-8 is an
/// InputError naming the byte offset (Python strings, what Hugging Face encodes, cannot hold it).
class TORCHPATCH_API Tokenizer {
 public:
  /// dir/tokenizer.json, and dir/tokenizer_config.json when present (a GGUF file's tokenizer:
  /// runtime/gguf_model.h).
  static Tokenizer from_pretrained(const std::filesystem::path& dir);
  /// A tokenizer.json file, with an optional tokenizer_config.json.
  static Tokenizer from_file(const std::filesystem::path& tokenizer_json,
                            const std::optional<std::filesystem::path>& tokenizer_config = std::nullopt);

  /// A tokenizer.json already parsed, with a tokenizer_config.json's object when given; `source`
  /// (and `config_source`) name them in messages.
  static Tokenizer from_json(const nlohmann::json& tokenizer, const nlohmann::json* tokenizer_config,
                             const std::filesystem::path& source, const std::string& config_source = {});
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  /// `add_special_tokens` = what the post-processor adds (e.g. BOS); special tokens written in the
  /// text are matched either way, as Hugging Face does.
  Encoding encode(const std::string& text, bool add_special_tokens = true) const;
  std::vector<Encoding> encode_batch(const std::vector<std::string>& texts, bool add_special_tokens = true) const;
  /// Encodes and pads every row to the longest with the pad token (else eos; an error if it has
  /// neither), on `side`, by default padding_side(). tokenizer.json's padding strategy (such as
  /// padding to a fixed 128) and truncation are not applied, as transformers does not unless asked.
  PaddedBatch encode_padded(const std::vector<std::string>& texts, bool add_special_tokens = true,
                            std::optional<PaddingSide> side = std::nullopt) const;
  /// The side encode_padded pads by default: tokenizer_config.json's padding_side, else the
  /// direction of tokenizer.json's padding section, else right for a WordPiece model (BERT-style
  /// encoders) and left for any other (decoders).
  PaddingSide padding_side() const;

  /// Text of ids; ids outside the vocabulary are an InputError naming them.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;

  std::optional<int64_t> token_to_id(const std::string& token) const;
  std::optional<std::string> id_to_token(int64_t id) const;
  /// Ids of the model vocabulary and the added tokens together.
  int64_t vocab_size() const;

  std::optional<int64_t> bos_token_id() const;
  std::optional<int64_t> eos_token_id() const;
  /// tokenizer_config.json's pad_token, else the pad token of tokenizer.json's padding section.
  std::optional<int64_t> pad_token_id() const;
  bool is_special(int64_t id) const;
  /// The tokenizer.json file it was read from.
  const std::filesystem::path& path() const;
  /// Whether decode applies tokenizer_config.json's clean_up_tokenization_spaces (" ," -> ",").
  bool cleans_up_spaces() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Turns a stream of generated ids into text without splitting a multi-byte character: each
/// `push` returns the text that became final (possibly empty). With a tokenizer that cleans up
/// spaces (" ," -> ",", " n't" -> "n't"), an end that the next token may still rewrite (" ", " n")
/// is held back, so the stream gives what `decode` gives.
class TORCHPATCH_API IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string push(int64_t id);
  /// Ids already shown (a prompt): they print nothing, and what follows is decoded in their context
  /// (so the first generated word keeps its leading space).
  void skip(const std::vector<int64_t>& ids);
  /// Whatever is still held back (an incomplete character at the end, as U+FFFD).
  std::string finish();

 private:
  std::pair<std::string, std::string> window() const;

  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int64_t> ids_;
  size_t prefix_ = 0, read_ = 0;
  size_t held_ = 0;  ///< trailing spaces of the decoded text not shown yet
};

}  // namespace torchpatch::text
