// Internal: the WordPiece model of tokenizer.json (BERT's vocabulary of words and "##" pieces).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/components.h"

namespace torchpatch::text {

/// What tokenizer.json's WordPiece model holds besides its vocabulary (tokenizers' defaults).
struct WordPieceOptions {
  std::string unk_token = "[UNK]";
  std::string continuing_subword_prefix = "##";  ///< marks a piece that continues a word
  size_t max_input_chars_per_word = 100;         ///< a longer word is one unknown token
};

class WordPiece : public Model {
 public:
  WordPiece(const nlohmann::json& model, const Source& where);

  /// Greedy longest match first: the longest vocabulary entry that starts the word, then the
  /// longest prefixed entry that starts the rest, and so on. A word that cannot be covered so is
  /// one unknown token. Time O(n * L) for a word of n bytes and a longest entry of L bytes.
  std::vector<WordToken> tokenize(const std::string& word) const override;

  std::optional<int64_t> token_to_id(const std::string& token) const override;
  const std::string* id_to_token(int64_t id) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(vocab_.size()); }

 private:
  WordPieceOptions options_;
  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<int64_t, std::string> tokens_;
  int64_t unk_ = 0;
  size_t longest_ = 0;  ///< bytes of the longest vocabulary entry
};

}  // namespace torchpatch::text
