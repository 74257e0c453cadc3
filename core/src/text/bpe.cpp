// BPE as tokenizers' model does it: a word starts as its characters (or their bytes, with byte
// fallback), then the adjacent pair of lowest merge rank is merged until none is left. A heap of
// candidate pairs over a linked list of symbols keeps it O(n log n) for any word length.
#include "text/bpe.h"

#include <queue>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace torchpatch::text {

Bpe::Bpe(const nlohmann::json& model, const Source& where) {
  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) fail(where, "the BPE model needs a 'vocab' object");
  vocab_.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > INT32_MAX) {
      fail(where.at("vocab"), fmt::format("token {} has id {}, not a non-negative integer", nlohmann::json(it.key()).dump(),
                                          it.value().dump()));
    }
    vocab_[it.key()] = it.value().get<int64_t>();
    tokens_[it.value().get<int64_t>()] = it.key();
  }
  const auto text_or_empty = [&](const char* key) {
    const auto it = model.find(key);
    return it != model.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  continuing_subword_prefix_ = text_or_empty("continuing_subword_prefix");
  end_of_word_suffix_ = text_or_empty("end_of_word_suffix");
  const auto merges = model.find("merges");
  if (merges != model.end() && !merges->is_array()) fail(where, "'merges' must be an array");
  if (merges != model.end()) {
    merges_.reserve(merges->size());
    for (size_t rank = 0; rank < merges->size(); ++rank) {
      const auto& m = (*merges)[rank];
      std::string left, right;
      if (m.is_string()) {  // "a b"
        const auto s = m.get<std::string>();
        const auto space = s.find(' ');
        if (space == std::string::npos) fail(where.at(fmt::format("merges[{}]", rank)), "a merge must be 'a b'");
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["a", "b"]
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        fail(where.at(fmt::format("merges[{}]", rank)), "a merge must be \"a b\" or [\"a\", \"b\"]");
      }
      // With a continuing-subword prefix the right part carries it and the merged token does not.
      const std::string& prefix = continuing_subword_prefix_;
      const bool prefixed = !prefix.empty() && right.compare(0, prefix.size(), prefix) == 0;
      const auto a = vocab_.find(left), b = vocab_.find(right);
      const auto ab = vocab_.find(left + (prefixed ? right.substr(prefix.size()) : right));
      if (a == vocab_.end() || b == vocab_.end() || ab == vocab_.end()) {
        fail(where.at(fmt::format("merges[{}]", rank)),
             fmt::format("merge '{} {}' uses a token that is not in the vocabulary", left, right));
      }
      merges_.emplace(pair_key(a->second, b->second), Merge{static_cast<int64_t>(rank), ab->second});
    }
  }
  const auto unk = text_or_empty("unk_token");
  if (!unk.empty()) {
    const auto it = vocab_.find(unk);
    if (it == vocab_.end()) fail(where, fmt::format("unk_token '{}' is not in the vocabulary", unk));
    unk_ = it->second;
  }
  fuse_unk_ = model.value("fuse_unk", false);
  byte_fallback_ = model.value("byte_fallback", false);
  ignore_merges_ = model.value("ignore_merges", false);
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() > 0) {
    fail(where, "BPE dropout is not supported (it makes encoding random)");
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
}

std::optional<int64_t> Bpe::token_to_id(const std::string& token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? std::nullopt : std::optional<int64_t>(it->second);
}

const std::string* Bpe::id_to_token(int64_t id) const {
  const auto it = tokens_.find(id);
  return it == tokens_.end() ? nullptr : &it->second;
}

std::vector<WordToken> Bpe::initial_symbols(const std::string& word) const {
  std::vector<WordToken> symbols;
  std::optional<WordToken> pending_unk;
  for (size_t i = 0; i < word.size();) {
    const size_t start = i;
    next_code_point(word, i);
    std::string s = word.substr(start, i - start);
    if (start > 0) s = continuing_subword_prefix_ + s;
    if (i == word.size()) s += end_of_word_suffix_;
    if (const auto it = vocab_.find(s); it != vocab_.end()) {
      if (pending_unk) symbols.push_back(*pending_unk), pending_unk.reset();
      symbols.push_back({it->second, start, i});
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : s) all = all && byte_ids_[b] >= 0;
      if (all) {
        if (pending_unk) symbols.push_back(*pending_unk), pending_unk.reset();
        // Each byte token covers the character's bytes one by one (the last takes any rest).
        size_t at = start;
        for (size_t k = 0; k < s.size(); ++k) {
          const size_t end = k + 1 == s.size() ? i : std::min(i, at + 1);
          symbols.push_back({byte_ids_[static_cast<unsigned char>(s[k])], at, end});
          at = end;
        }
        continue;
      }
    }
    if (!unk_) continue;  // no unknown token: the character is dropped, as tokenizers does
    if (pending_unk && fuse_unk_) {
      pending_unk->end = i;
    } else {
      if (pending_unk) symbols.push_back(*pending_unk);
      pending_unk = WordToken{*unk_, start, i};
    }
  }
  if (pending_unk) symbols.push_back(*pending_unk);
  return symbols;
}

void Bpe::merge_all(std::vector<WordToken>& symbols) const {
  const int64_t n = static_cast<int64_t>(symbols.size());
  std::vector<int64_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int64_t i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  struct Candidate {
    int64_t rank, pos, left_id, right_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  const auto push = [&](int64_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    const auto it = merges_.find(pair_key(symbols[pos].id, symbols[next[pos]].id));
    if (it != merges_.end()) heap.push({it->second.rank, pos, symbols[pos].id, symbols[next[pos]].id});
  };
  for (int64_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const auto c = heap.top();
    heap.pop();
    const int64_t right = next[c.pos];
    // Stale: the left symbol was merged away or changed, or its right neighbour did.
    if (!alive[c.pos] || right < 0 || symbols[c.pos].id != c.left_id || symbols[right].id != c.right_id) continue;
    symbols[c.pos].id = merges_.at(pair_key(c.left_id, c.right_id)).id;
    symbols[c.pos].end = symbols[right].end;
    alive[right] = false;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  std::vector<WordToken> kept;
  for (int64_t i = n > 0 ? 0 : -1; i >= 0; i = next[i]) kept.push_back(symbols[i]);
  symbols = std::move(kept);
}

std::vector<WordToken> Bpe::tokenize(const std::string& word) const {
  if (word.empty()) return {};
  if (ignore_merges_) {
    if (const auto it = vocab_.find(word); it != vocab_.end()) return {{it->second, 0, word.size()}};
  }
  auto symbols = initial_symbols(word);
  merge_all(symbols);
  return symbols;
}

}  // namespace torchpatch::text
