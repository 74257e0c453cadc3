// Decoders: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, WordPiece, Sequence.
#include <string_view>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "text/components.h"

namespace torchpatch::text {

namespace {

class ByteLevel : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string bytes;
    for (const auto& token : tokens) {
      // A token with a character outside the table (an added token, say) keeps its own bytes.
      std::string mapped;
      bool all = true;
      for (size_t i = 0; i < token.size() && all;) {
        const int b = byte_level_byte(next_code_point(token, i));
        if (b < 0) all = false;
        mapped += static_cast<char>(b);
      }
      bytes += all ? mapped : token;
    }
    return {utf8_lossy(bytes)};
  }
};

class Replace : public Decoder {
 public:
  Replace(Pattern pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (auto& token : tokens) {
      std::string out;
      size_t at = 0;
      for (const auto& [b, e] : pattern_.find_all(token)) {
        out.append(token, at, b - at);
        out += content_;
        at = e;
      }
      out.append(token, at, std::string::npos);
      token = std::move(out);
    }
    return tokens;
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// "<0xXX>" tokens in a row become their bytes: one string if they are valid UTF-8, else one
// U+FFFD per byte.
class ByteFallback : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    const auto flush = [&] {
      if (pending.empty()) return;
      if (valid_utf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xef\xbf\xbd");
      }
      pending.clear();
    };
    for (auto& token : tokens) {
      if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>' && std::isxdigit(token[3]) &&
          std::isxdigit(token[4])) {
        pending += static_cast<char>(std::stoi(token.substr(3, 2), nullptr, 16));
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    return out;
  }
};

class Fuse : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    return {all};
  }
};

// Up to `start` leading and `stop` trailing copies of one character removed from each token.
class Strip : public Decoder {
 public:
  Strip(std::string content, size_t start, size_t stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (auto& token : tokens) {
      size_t begin = 0, end = token.size();
      for (size_t k = 0; k < start_ && token.compare(begin, content_.size(), content_) == 0 && begin < end; ++k) {
        begin += content_.size();
      }
      for (size_t k = 0; k < stop_ && end >= begin + content_.size() &&
                         token.compare(end - content_.size(), content_.size(), content_) == 0;
           ++k) {
        end -= content_.size();
      }
      token = token.substr(begin, end - begin);
    }
    return tokens;
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class Metaspace : public Decoder {
 public:
  Metaspace(std::string replacement, bool strip_first) : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const auto& token = tokens[i];
      for (size_t at = 0; at < token.size();) {
        if (token.compare(at, replacement_.size(), replacement_) == 0) {
          out += ' ';
          at += replacement_.size();
        } else {
          out += token[at++];
        }
      }
      if (i == 0 && strip_first_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
      tokens[i] = std::move(out);
    }
    return tokens;
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

// Words joined by spaces, a piece that continues a word ("##ing") joined without one. The cleanup
// is tokenizers' own (it differs from transformers' clean_up_tokenization by " do not" -> " don't")
// and runs on each token with its space, so a rule never spans two tokens.
class WordPiece : public Decoder {
 public:
  WordPiece(std::string prefix, bool cleanup) : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    static const std::pair<std::string_view, std::string_view> kRules[] = {
        {" .", "."},     {" ?", "?"},     {" !", "!"},         {" ,", ","},     {" ' ", "'"},   {" n't", "n't"},
        {" 'm", "'m"},   {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (size_t i = 0; i < tokens.size(); ++i) {
      auto& token = tokens[i];
      if (i > 0) {
        // The first token keeps its prefix: nothing precedes it to continue.
        token = token.compare(0, prefix_.size(), prefix_) == 0 ? token.substr(prefix_.size()) : " " + token;
      }
      if (!cleanup_) continue;
      for (const auto& [from, to] : kRules) token = replace_all(token, from, to);
    }
    return tokens;
  }

 private:
  std::string prefix_;
  bool cleanup_;
};

class Sequence : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> stages) : stages_(std::move(stages)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (const auto& stage : stages_) tokens = stage->decode_chain(std::move(tokens));
    return tokens;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> stages_;
};

size_t count_field(const nlohmann::json& j, const char* key, const Source& where) {
  const auto it = j.find(key);
  if (it == j.end()) return 0;
  if (!it->is_number_unsigned()) fail(where, fmt::format("'{}' must be a non-negative integer", key));
  return it->get<size_t>();
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const Source& where) {
  if (!j.is_object()) fail(where, "a decoder must be an object");
  const auto type = string_field(j, "type", where);
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "Replace") {
    return std::make_unique<Replace>(Pattern(j.value("pattern", nlohmann::json()), where.at("pattern")),
                                     string_field(j, "content", where));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip") {
    return std::make_unique<Strip>(string_field(j, "content", where), count_field(j, "start", where),
                                   count_field(j, "stop", where));
  }
  if (type == "Metaspace") {
    bool strip_first = j.value("add_prefix_space", true);
    if (j.contains("prepend_scheme")) strip_first = string_field(j, "prepend_scheme", where) != "never";
    return std::make_unique<Metaspace>(j.value("replacement", std::string("\xe2\x96\x81")), strip_first);
  }
  if (type == "WordPiece") {
    const std::string prefix = j.contains("prefix") ? string_field(j, "prefix", where) : "##";
    return std::make_unique<WordPiece>(prefix, bool_field(j, "cleanup", true, where));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> stages;
    for (const auto& [item, source] : sequence_items(j, "decoders", where)) stages.push_back(make_decoder(*item, source));
    return std::make_unique<Sequence>(std::move(stages));
  }
  fail(where, fmt::format("unsupported decoder '{}' (supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, "
                          "Metaspace, WordPiece, Sequence)",
                          type));
}

}  // namespace torchpatch::text
