// The tokenizer a GGUF file carries, as the tokenizer.json it was converted from. llama.cpp's
// converter writes the vocabulary (tokenizer.ggml.tokens, merges or scores, token types), the special
// tokens, whether to add BOS/EOS, and for byte-level vocabularies the name of the pre-tokenizer
// (tokenizer.ggml.pre, the hash of the original's behaviour): each name stands for a pre-tokenizer
// pipeline, rebuilt here. A SentencePiece vocabulary ("llama") is rebuilt as transformers' GGUF loader
// builds it: merges from the scores, and a pipeline chosen by the architecture.
#include <algorithm>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "torchpatch/checkpoint/gguf.h"
#include "torchpatch/error.h"
#include "torchpatch/printable.h"
#include "torchpatch/runtime/gguf_model.h"
#include "torchpatch/text/tokenizer.h"

namespace torchpatch {

namespace {

using checkpoint::GgufFile;
using checkpoint::GgufType;
using checkpoint::GgufValue;
using json = nlohmann::json;

// llama.cpp's token types.
constexpr int64_t kControl = 3, kUserDefined = 4;

json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

json split(const char* regex) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
}

// The pre-tokenizers of the byte-level vocabularies, by llama.cpp's name for them.
const std::map<std::string, json>& pre_tokenizers() {
  static const std::map<std::string, json> known = [] {
    const char* llama3 = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    const char* qwen2 = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    const json gpt2 = byte_level(true);
    const json digits = {{"type", "Digits"}, {"individual_digits", true}};
    return std::map<std::string, json>{
        {"default", gpt2},
        {"gpt-2", gpt2},
        {"smollm", {{"type", "Sequence"}, {"pretokenizers", {digits, gpt2}}}},
        {"starcoder", {{"type", "Sequence"}, {"pretokenizers", {digits, gpt2}}}},
        {"llama-bpe", {{"type", "Sequence"}, {"pretokenizers", {split(llama3), byte_level(false)}}}},
        {"qwen2", {{"type", "Sequence"}, {"pretokenizers", {split(qwen2), byte_level(false)}}}},
    };
  }();
  return known;
}

class VocabReader {
 public:
  explicit VocabReader(const GgufFile& file) : file_(file) {}

  [[noreturn]] void fail(const std::string& key, const std::string& cause) const {
    throw ConfigError(fmt::format("{}: metadata '{}': {}", file_.path().string(), key, cause));
  }
  const GgufValue* find(const std::string& key) const { return file_.find_value(key); }
  std::string text(const std::string& key, const std::string& fallback) const {
    const auto* v = find(key);
    if (v == nullptr) return fallback;
    if (v->type != GgufType::STRING) fail(key, fmt::format("a {}, not a STRING", gguf_type_name(v->type)));
    return v->text;
  }
  const std::vector<GgufValue>& array(const std::string& key, GgufType element, bool required) const {
    static const std::vector<GgufValue> none;
    const auto* v = find(key);
    if (v == nullptr) {
      if (required) fail(key, "missing: the file carries no tokenizer (give one with --tokenizer DIR)");
      return none;
    }
    if (v->type != GgufType::ARRAY || v->element_type != element) {
      fail(key, fmt::format("not an array of {}", gguf_type_name(element)));
    }
    return v->array;
  }
  std::optional<int64_t> id(const std::string& key, size_t vocab) const {
    const auto* v = find(key);
    if (v == nullptr) return std::nullopt;
    const auto i = v->as_int();
    if (!i || *i < 0 || static_cast<size_t>(*i) >= vocab) {
      fail(key, fmt::format("not a token id of the {}-token vocabulary", vocab));
    }
    return i;
  }
  bool flag(const std::string& key, bool fallback) const {
    const auto* v = find(key);
    if (v == nullptr) return fallback;
    if (v->type != GgufType::BOOL) fail(key, fmt::format("a {}, not a BOOL", gguf_type_name(v->type)));
    return v->boolean;
  }

 private:
  const GgufFile& file_;
};

// tokenizer_config.json: the special tokens by name, whether to add BOS (`add_bos` where the file does
// not say) and EOS.
json special_tokens_config(const VocabReader& r, const std::vector<GgufValue>& tokens, bool add_bos) {
  json config = json::object();
  const auto special = [&](const char* key, const char* field) {
    if (const auto id = r.id(key, tokens.size())) config[field] = tokens[static_cast<size_t>(*id)].text;
  };
  special("tokenizer.ggml.bos_token_id", "bos_token");
  special("tokenizer.ggml.eos_token_id", "eos_token");
  special("tokenizer.ggml.padding_token_id", "pad_token");
  special("tokenizer.ggml.unknown_token_id", "unk_token");
  config["add_bos_token"] = r.flag("tokenizer.ggml.add_bos_token", add_bos);
  config["add_eos_token"] = r.flag("tokenizer.ggml.add_eos_token", false);
  return config;
}

// tokenizer.json and tokenizer_config.json of a byte-level BPE vocabulary (tokenizer.ggml.model "gpt2").
std::pair<json, json> byte_level_bpe(const VocabReader& r) {
  const auto& tokens = r.array("tokenizer.ggml.tokens", GgufType::STRING, true);
  const auto& types = r.array("tokenizer.ggml.token_type", GgufType::INT32, false);
  const auto& merges = r.array("tokenizer.ggml.merges", GgufType::STRING, true);
  if (!types.empty() && types.size() != tokens.size()) {
    r.fail("tokenizer.ggml.token_type", fmt::format("{} types for {} tokens", types.size(), tokens.size()));
  }
  const auto pre_name = r.text("tokenizer.ggml.pre", "default");
  const auto pre = pre_tokenizers().find(pre_name);
  if (pre == pre_tokenizers().end()) {
    std::string known;
    for (const auto& [name, pipeline] : pre_tokenizers()) known += (known.empty() ? "" : ", ") + name;
    r.fail("tokenizer.ggml.pre", fmt::format("pre-tokenizer '{}' is not one torchpatch rebuilds ({}): give the "
                                             "model's tokenizer.json with --tokenizer DIR", printable(pre_name), known));
  }
  json vocab = json::object();
  json added = json::array();
  for (size_t id = 0; id < tokens.size(); ++id) {
    const auto& token = tokens[id].text;
    if (!vocab.emplace(token, id).second) {
      r.fail("tokenizer.ggml.tokens", fmt::format("token '{}' is given twice (ids {} and {})", printable(token),
                                                  vocab[token].get<int64_t>(), id));
    }
    const int64_t type = types.empty() ? 1 : static_cast<int64_t>(types[id].integer);
    if (type == kControl || type == kUserDefined) {
      added.push_back({{"id", id}, {"content", token}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", type == kUserDefined}, {"special", type == kControl}});
    }
  }
  json merge_list = json::array();
  for (const auto& m : merges) merge_list.push_back(m.text);
  json tokenizer{{"version", "1.0"},
                 {"added_tokens", added},
                 {"normalizer", nullptr},
                 {"pre_tokenizer", pre->second},
                 {"post_processor", nullptr},
                 {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
                 {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}, {"ignore_merges", pre_name == "llama-bpe"},
                            {"byte_fallback", false}, {"fuse_unk", false}, {"unk_token", nullptr}}}};
  return {tokenizer, special_tokens_config(r, tokens, /*add_bos=*/false)};
}

// -- SentencePiece vocabularies (tokenizer.ggml.model "llama") --------------------------------------------

constexpr const char* kMetaspace = "\xe2\x96\x81";  // U+2581, SentencePiece's word boundary

// Where each code point of `s` (UTF-8) starts.
std::vector<size_t> code_point_starts(std::string_view s) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) starts.push_back(i);
  }
  return starts;
}

// Python's str.isspace() of every character of `s`, with at least one ' ': a token that Gemma's files
// spell with real spaces ("  ") where its tokenizer spells "▁▁". Returns how many characters, or 0.
size_t spaces_run(std::string_view s) {
  if (s.find(' ') == std::string_view::npos) return 0;
  size_t count = 0;
  for (size_t i = 0; i < s.size(); ++count) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (i + n > s.size()) return 0;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) cp = cp << 6 | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    const bool space = (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
                       cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
                       cp == 0x202F || cp == 0x205F || cp == 0x3000;
    if (!space) return 0;
    i += n;
  }
  return count;
}

constexpr size_t kMaxMergedBytes = 1024;

// The merges a vocabulary without any implies (transformers' generate_merges): every split of every
// token into two tokens of the vocabulary, the splits of one token in the order of their pieces' ids,
// then all of them by the token's score, best first (ties: longer left piece, then longer right piece,
// then as found).
json merges_from_scores(const std::vector<std::string>& tokens, const std::vector<double>& scores) {
  std::unordered_map<std::string_view, int64_t> id;  // a token given twice: its last id, as Python's dict
  for (size_t i = 0; i < tokens.size(); ++i) id[tokens[i]] = static_cast<int64_t>(i);
  struct Merge {
    std::string_view left, right;
    double score;
    size_t left_chars, right_chars;
  };
  std::vector<Merge> merges;
  std::unordered_map<std::string_view, bool> seen;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string_view token = tokens[i];
    // Once per token, with its last score. A token past kMaxMergedBytes takes no part: each split
    // costs its length, so a hostile file's one huge token would cost its length squared (no real
    // vocabulary has a token of that length).
    if (!seen.emplace(token, true).second || token.size() > kMaxMergedBytes) continue;
    const double score = scores[static_cast<size_t>(id[token])];
    const auto starts = code_point_starts(token);
    const size_t first = merges.size();
    for (size_t k = 1; k < starts.size(); ++k) {
      const auto left = token.substr(0, starts[k]), right = token.substr(starts[k]);
      if (id.count(left) != 0 && id.count(right) != 0) merges.push_back({left, right, score, k, starts.size() - k});
    }
    std::stable_sort(merges.begin() + static_cast<std::ptrdiff_t>(first), merges.end(), [&](const Merge& a, const Merge& b) {
      return std::pair(id[a.left], id[a.right]) < std::pair(id[b.left], id[b.right]);
    });
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    return std::tuple(a.score, a.left_chars, a.right_chars) > std::tuple(b.score, b.left_chars, b.right_chars);
  });
  json out = json::array();
  for (const auto& m : merges) out.push_back(json::array({std::string(m.left), std::string(m.right)}));
  return out;
}

json string_pattern(const char* s) { return {{"String", s}}; }

// tokenizer.json and tokenizer_config.json of a SentencePiece vocabulary, by architecture as
// transformers builds them: Llama's (a Metaspace pre-tokenizer that prepends "▁" to the first word),
// Phi-3's (the prefix from a normalizer, so leading spaces stay), Gemma's (spaces replaced, no prefix,
// tokens of real spaces respelled, merges in the order of the tokens rather than by score).
std::pair<json, json> sentencepiece_bpe(const VocabReader& r, const std::string& architecture) {
  const auto& token_values = r.array("tokenizer.ggml.tokens", GgufType::STRING, true);
  const auto& types = r.array("tokenizer.ggml.token_type", GgufType::INT32, false);
  const auto& file_merges = r.array("tokenizer.ggml.merges", GgufType::STRING, false);
  const auto& score_values = r.array("tokenizer.ggml.scores", GgufType::FLOAT32, file_merges.empty());
  const size_t n = token_values.size();
  if (!types.empty() && types.size() != n) r.fail("tokenizer.ggml.token_type", fmt::format("{} types for {} tokens", types.size(), n));
  if (!score_values.empty() && score_values.size() != n) r.fail("tokenizer.ggml.scores", fmt::format("{} scores for {} tokens", score_values.size(), n));
  const bool gemma = architecture == "gemma" || architecture == "gemma2" || architecture == "gemma3";
  const bool phi3 = architecture == "phi3";
  std::vector<std::string> tokens(n);
  std::vector<double> scores(n);
  for (size_t i = 0; i < n; ++i) {
    tokens[i] = token_values[i].text;
    if (gemma) {
      if (const size_t run = spaces_run(tokens[i])) {
        tokens[i].clear();
        for (size_t k = 0; k < run; ++k) tokens[i] += kMetaspace;
      }
      scores[i] = -static_cast<double>(i);  // Gemma's scores do not follow its merges; its order does
    } else if (!score_values.empty()) {
      scores[i] = static_cast<double>(score_values[i].real);
    }
  }
  // Special: the control tokens, and the tokens the file names BOS, EOS, unknown and padding (the
  // tokenizer registers those as special whatever their type; Gemma's also its "<mask>").
  std::vector<bool> named(n, false);
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
                          "tokenizer.ggml.padding_token_id"}) {
    if (const auto id = r.id(key, n)) named[static_cast<size_t>(*id)] = true;
  }
  json vocab = json::object(), added = json::array();
  for (size_t i = 0; i < n; ++i) {
    vocab[tokens[i]] = i;
    const int64_t type = types.empty() ? 1 : static_cast<int64_t>(types[i].integer);
    const bool special = type == kControl || named[i] || (gemma && tokens[i] == "<mask>");
    if (special || type == kUserDefined) {
      added.push_back({{"id", i}, {"content", tokens[i]}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", false}, {"special", special}});
    }
  }
  json merges = json::array();
  if (!file_merges.empty()) {
    for (const auto& m : file_merges) merges.push_back(m.text);
  } else {
    merges = merges_from_scores(tokens, scores);
  }
  json decoders = json::array({{{"type", "Replace"}, {"pattern", string_pattern(kMetaspace)}, {"content", " "}},
                               {{"type", "ByteFallback"}}, {{"type", "Fuse"}}});
  if (!gemma) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1u}, {"stop", 0u}});
  json normalizer = nullptr, pre_tokenizer = nullptr;
  if (gemma) {
    normalizer = {{"type", "Replace"}, {"pattern", string_pattern(" ")}, {"content", kMetaspace}};
    pre_tokenizer = {{"type", "Split"}, {"pattern", string_pattern(" ")}, {"behavior", "MergedWithPrevious"}, {"invert", false}};
  } else if (phi3) {
    normalizer = {{"type", "Sequence"},
                  {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", kMetaspace}},
                                               {{"type", "Replace"}, {"pattern", string_pattern(" ")}, {"content", kMetaspace}}})}};
  } else {
    pre_tokenizer = {{"type", "Metaspace"}, {"replacement", kMetaspace}, {"prepend_scheme", "first"}, {"split", false}};
  }
  // Gemma's BPE names an unknown token (its own "<unk>"); Llama's does not: byte fallback covers all.
  json unk = nullptr;
  if (gemma && vocab.contains("<unk>")) unk = "<unk>";
  json tokenizer{{"version", "1.0"},
                 {"added_tokens", added},
                 {"normalizer", normalizer},
                 {"pre_tokenizer", pre_tokenizer},
                 {"post_processor", nullptr},
                 {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}},
                 {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"ignore_merges", false},
                            {"byte_fallback", true}, {"fuse_unk", true}, {"unk_token", unk}}}};
  // llama.cpp adds BOS to a SentencePiece vocabulary whose file does not say otherwise.
  return {tokenizer, special_tokens_config(r, token_values, /*add_bos=*/true)};
}

}  // namespace

namespace {

// llama.cpp's names for a file without a vocabulary (it runs the weights, not text).
bool is_no_vocabulary(const std::string& model) { return model == "none" || model == "no_vocab"; }

std::pair<json, json> tokenizer_json_of(const GgufFile& file) {
  const VocabReader r(file);
  const auto model = r.text("tokenizer.ggml.model", "");
  if (model.empty()) r.fail("tokenizer.ggml.model", "missing: the file carries no tokenizer (give one with --tokenizer DIR)");
  if (is_no_vocabulary(model)) {
    r.fail("tokenizer.ggml.model", fmt::format("'{}': the file carries no vocabulary (give the model's tokenizer with "
                                               "--tokenizer DIR)", model));
  }
  if (model == "gpt2") return byte_level_bpe(r);
  if (model == "llama") return sentencepiece_bpe(r, r.text("general.architecture", ""));
  r.fail("tokenizer.ggml.model", fmt::format("vocabulary kind '{}' is not read from GGUF files yet (byte-level BPE "
                                             "'gpt2' and SentencePiece 'llama' are): give the model's tokenizer.json "
                                             "with --tokenizer DIR",
                                             printable(model)));
}

}  // namespace

text::Tokenizer gguf_tokenizer(const std::filesystem::path& path) {
  const auto [tokenizer, config] = tokenizer_json_of(*GgufFile::open(path));
  return text::Tokenizer::from_json(tokenizer, &config, path, path.string());
}

std::vector<std::pair<std::string, std::string>> gguf_tokenizer_files(const std::filesystem::path& path) {
  const auto file = GgufFile::open(path);  // one read of its header, vocabulary included
  const auto* model = file->find_value("tokenizer.ggml.model");
  if (model == nullptr || (model->type == GgufType::STRING && is_no_vocabulary(model->text))) return {};
  const auto [tokenizer, config] = tokenizer_json_of(*file);
  return {{"tokenizer.json", tokenizer.dump(2)}, {"tokenizer_config.json", config.dump(2)}};
}

text::Tokenizer tokenizer_of(const std::filesystem::path& model) {
  if (const auto gguf = checkpoint::gguf_file_of(model, "tokenizer.json")) return gguf_tokenizer(*gguf);
  return text::Tokenizer::from_pretrained(model);
}

}  // namespace torchpatch
