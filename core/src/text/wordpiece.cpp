// WordPiece as tokenizers' model does it (the algorithm of BERT's original tokenizer).
#include "text/wordpiece.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace torchpatch::text {

WordPiece::WordPiece(const nlohmann::json& model, const Source& where) {
  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) {
    fail(where, "the WordPiece model needs a 'vocab' object (token -> id)");
  }
  vocab_.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > INT32_MAX) {
      fail(where.at("vocab"), fmt::format("token {} has id {}, not a non-negative integer",
                                          nlohmann::json(it.key()).dump(), it.value().dump()));
    }
    vocab_[it.key()] = it.value().get<int64_t>();
    tokens_[it.value().get<int64_t>()] = it.key();
    longest_ = std::max(longest_, it.key().size());
  }
  if (model.contains("unk_token")) options_.unk_token = string_field(model, "unk_token", where);
  if (model.contains("continuing_subword_prefix")) {
    options_.continuing_subword_prefix = string_field(model, "continuing_subword_prefix", where);
  }
  if (const auto it = model.find("max_input_chars_per_word"); it != model.end()) {
    if (!it->is_number_unsigned()) {
      fail(where, fmt::format("'max_input_chars_per_word' must be a non-negative integer, not {}", it->dump()));
    }
    options_.max_input_chars_per_word = it->get<size_t>();
  }
  // tokenizers only finds a missing unknown token when a word needs it; here the file is refused
  // when it is read, before any text depends on it.
  const auto unk = vocab_.find(options_.unk_token);
  if (unk == vocab_.end()) {
    fail(where, fmt::format("unk_token '{}' is not in the vocabulary (set 'unk_token' to an entry of 'vocab')",
                            options_.unk_token));
  }
  unk_ = unk->second;
}

std::optional<int64_t> WordPiece::token_to_id(const std::string& token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? std::nullopt : std::optional<int64_t>(it->second);
}

const std::string* WordPiece::id_to_token(int64_t id) const {
  const auto it = tokens_.find(id);
  return it == tokens_.end() ? nullptr : &it->second;
}

std::vector<WordToken> WordPiece::tokenize(const std::string& word) const {
  if (word.empty()) return {};
  const std::vector<WordToken> unknown{{unk_, 0, word.size()}};
  size_t chars = 0;
  for (size_t i = 0; i < word.size() && chars <= options_.max_input_chars_per_word; ++chars) next_code_point(word, i);
  if (chars > options_.max_input_chars_per_word) return unknown;

  std::vector<WordToken> out;
  std::string candidate;
  for (size_t start = 0; start < word.size();) {
    // The candidate is the prefix (past the first piece) and word[start, end); it loses its last
    // character until the vocabulary has it. It starts no longer than the longest entry, which
    // keeps a long word linear in its length.
    candidate = start > 0 ? options_.continuing_subword_prefix : std::string();
    const size_t head = candidate.size();
    size_t end = std::min(word.size(), start + longest_);
    while (end < word.size() && (static_cast<unsigned char>(word[end]) & 0xc0) == 0x80) --end;
    candidate.append(word, start, end - start);
    std::optional<int64_t> id;
    while (end > start) {
      if (const auto it = vocab_.find(candidate); it != vocab_.end()) {
        id = it->second;
        break;
      }
      size_t last = end - 1;
      while (last > start && (static_cast<unsigned char>(word[last]) & 0xc0) == 0x80) --last;
      end = last;
      candidate.resize(head + (end - start));
    }
    if (!id) return unknown;  // one uncovered part makes the whole word unknown
    out.push_back({*id, start, end});
    start = end;
  }
  return out;
}

}  // namespace torchpatch::text
