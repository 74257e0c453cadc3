// Internal: the BPE model of tokenizer.json (merges by rank, byte fallback, unknown tokens).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/components.h"

namespace torchpatch::text {

class Bpe : public Model {
 public:
  Bpe(const nlohmann::json& model, const Source& where);

  /// The tokens of one pre-tokenized piece; time O(n log n) in its length.
  std::vector<WordToken> tokenize(const std::string& word) const override;

  std::optional<int64_t> token_to_id(const std::string& token) const override;
  const std::string* id_to_token(int64_t id) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(vocab_.size()); }

 private:
  struct Merge {
    int64_t rank;
    int64_t id;  ///< the merged token
  };
  static uint64_t pair_key(int64_t a, int64_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }
  std::vector<WordToken> initial_symbols(const std::string& word) const;
  void merge_all(std::vector<WordToken>& symbols) const;

  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<int64_t, std::string> tokens_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int64_t> unk_;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  int64_t byte_ids_[256];  ///< "<0xXX>" ids, -1 where missing (byte fallback)
};

}  // namespace torchpatch::text
