// The tokenizer a GGUF file carries, as the tokenizer.json it was converted from. llama.cpp's
// converter writes the vocabulary (tokenizer.ggml.tokens, merges, token types), the special tokens,
// whether to add BOS/EOS, and the name of the pre-tokenizer (tokenizer.ggml.pre, the hash of the
// original's behaviour): each name stands for a pre-tokenizer pipeline, rebuilt here.
#include <map>
#include <string>

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
  json config = json::object();
  const auto special = [&](const char* key, const char* field) {
    if (const auto id = r.id(key, tokens.size())) config[field] = tokens[static_cast<size_t>(*id)].text;
  };
  special("tokenizer.ggml.bos_token_id", "bos_token");
  special("tokenizer.ggml.eos_token_id", "eos_token");
  special("tokenizer.ggml.padding_token_id", "pad_token");
  special("tokenizer.ggml.unknown_token_id", "unk_token");
  config["add_bos_token"] = r.flag("tokenizer.ggml.add_bos_token", false);
  config["add_eos_token"] = r.flag("tokenizer.ggml.add_eos_token", false);
  return {tokenizer, config};
}

}  // namespace

namespace {

std::pair<json, json> tokenizer_json_of(const GgufFile& file) {
  const VocabReader r(file);
  const auto model = r.text("tokenizer.ggml.model", "");
  if (model.empty()) r.fail("tokenizer.ggml.model", "missing: the file carries no tokenizer (give one with --tokenizer DIR)");
  if (model != "gpt2") {
    r.fail("tokenizer.ggml.model", fmt::format("vocabulary kind '{}' is not read from GGUF files yet (byte-level BPE, "
                                               "'gpt2', is): give the model's tokenizer.json with --tokenizer DIR",
                                               printable(model)));
  }
  return byte_level_bpe(r);
}

}  // namespace

text::Tokenizer gguf_tokenizer(const std::filesystem::path& path) {
  const auto [tokenizer, config] = tokenizer_json_of(*GgufFile::open(path));
  return text::Tokenizer::from_json(tokenizer, &config, path, path.string());
}

std::vector<std::pair<std::string, std::string>> gguf_tokenizer_files(const std::filesystem::path& path) {
  const auto file = GgufFile::open(path);  // one read of its header, vocabulary included
  if (file->find_value("tokenizer.ggml.model") == nullptr) return {};
  const auto [tokenizer, config] = tokenizer_json_of(*file);
  return {{"tokenizer.json", tokenizer.dump(2)}, {"tokenizer_config.json", config.dump(2)}};
}

text::Tokenizer tokenizer_of(const std::filesystem::path& model) {
  if (const auto gguf = checkpoint::gguf_file_of(model, "tokenizer.json")) return gguf_tokenizer(*gguf);
  return text::Tokenizer::from_pretrained(model);
}

}  // namespace torchpatch
