// Normalizers: NFC, NFD, NFKC, NFKD (ICU), Lowercase, Prepend, Replace, Strip, BertNormalizer,
// Sequence.
#include <algorithm>

#include <nlohmann/json.hpp>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/locid.h>
#include <unicode/unistr.h>

#include <fmt/format.h>

#include "text/components.h"

namespace torchpatch::text {

namespace {

// Unicode normalization, applied per run between normalization boundaries so that each output
// byte stays aligned to the original characters it came from.
class UnicodeForm : public Normalizer {
 public:
  UnicodeForm(const icu::Normalizer2* form) : form_(form) {}

  Normalized normalize(Normalized in) const override {
    UErrorCode status = U_ZERO_ERROR;
    const auto whole = icu::UnicodeString::fromUTF8(in.text);
    if (form_->quickCheck(whole, status) == UNORM_YES && U_SUCCESS(status)) return in;
    Normalized out;
    size_t run = 0;
    for (size_t i = 0; i < in.text.size();) {
      const size_t start = i;
      const char32_t c = next_code_point(in.text, i);
      if (start > run && form_->hasBoundaryBefore(static_cast<UChar32>(c))) {
        append_run(in, run, start, out);
        run = start;
      }
    }
    append_run(in, run, in.text.size(), out);
    return out;
  }

 private:
  void append_run(const Normalized& in, size_t begin, size_t end, Normalized& out) const {
    if (end <= begin) return;
    UErrorCode status = U_ZERO_ERROR;
    const auto normalized = form_->normalize(icu::UnicodeString::fromUTF8(in.text.substr(begin, end - begin)), status);
    std::string utf8;
    normalized.toUTF8String(utf8);
    // A run that stays as it is keeps its per-character alignment.
    if (utf8 == std::string_view(in.text).substr(begin, end - begin)) {
      out.append(in, begin, end);
    } else if (!append_each(in, begin, end, utf8, out)) {
      out.append(utf8, in.origin_of(begin, end));
    }
  }

  // Where the run's characters, each normalized alone and their marks then put in canonical order,
  // give the run's normalization (any decomposition), each output character is aligned to the
  // character it came from, as tokenizers aligns them; a composition is aligned to the whole run.
  // Whether it fit.
  bool append_each(const Normalized& in, size_t begin, size_t end, const std::string& whole, Normalized& out) const {
    std::vector<std::pair<char32_t, Range>> chars;
    for (size_t i = begin; i < end;) {
      const size_t start = i;
      next_code_point(in.text, i);
      UErrorCode status = U_ZERO_ERROR;
      const auto one = form_->normalize(icu::UnicodeString::fromUTF8(in.text.substr(start, i - start)), status);
      for (int32_t k = 0; k < one.length(); k = one.moveIndex32(k, 1)) {
        chars.emplace_back(static_cast<char32_t>(one.char32At(k)), in.origin_of(start, i));
      }
    }
    const auto ccc = [](const std::pair<char32_t, Range>& c) {
      return u_getCombiningClass(static_cast<UChar32>(c.first));
    };
    for (size_t k = 0; k < chars.size();) {
      size_t stop = k;
      while (stop < chars.size() && ccc(chars[stop]) != 0) ++stop;
      const auto first = chars.begin() + static_cast<std::ptrdiff_t>(k);
      std::stable_sort(first, first + static_cast<std::ptrdiff_t>(stop - k),
                       [&](const auto& a, const auto& b) { return ccc(a) < ccc(b); });
      k = stop + 1;
    }
    Normalized parts;
    for (const auto& [c, from] : chars) {
      std::string utf8;
      append_utf8(utf8, c);
      parts.append(utf8, from);
    }
    if (parts.text != whole) return false;
    out.append(parts, 0, parts.text.size());
    return true;
  }

  const icu::Normalizer2* form_;
};

class Lowercase : public Normalizer {
 public:
  Normalized normalize(Normalized in) const override {
    return map_code_points(in, [](char32_t c, const std::string& bytes) {
      if (c < 0x80) return std::string(1, static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
      std::string lower;
      icu::UnicodeString(static_cast<UChar32>(c)).toLower(icu::Locale::getRoot()).toUTF8String(lower);
      return lower;
    });
  }
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string text) : text_(std::move(text)) {}
  Normalized normalize(Normalized in) const override {
    if (in.empty()) return in;
    Normalized out;
    out.append(text_, {in.origin.front().first, in.origin.front().first});
    out.append(in, 0, in.text.size());
    return out;
  }

 private:
  std::string text_;
};

class Replace : public Normalizer {
 public:
  Replace(Pattern pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  Normalized normalize(Normalized in) const override {
    const auto matches = pattern_.find_all(in.text);
    if (matches.empty()) return in;
    Normalized out;
    size_t at = 0;
    for (const auto& [b, e] : matches) {
      out.append(in, at, b);
      out.append(content_, in.origin_of(b, e));
      at = e;
    }
    out.append(in, at, in.text.size());
    return out;
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  Normalized normalize(Normalized in) const override {
    size_t begin = 0, end = in.text.size();
    if (left_) {
      for (size_t i = 0; i < end;) {
        if (!u_isUWhiteSpace(static_cast<UChar32>(next_code_point(in.text, i)))) break;
        begin = i;
      }
    }
    if (right_) {
      // Walk forward remembering where the trailing whitespace run starts.
      size_t run = end;
      for (size_t i = begin; i < end;) {
        const size_t start = i;
        const bool space = u_isUWhiteSpace(static_cast<UChar32>(next_code_point(in.text, i)));
        if (!space) {
          run = end;
        } else if (run == end) {
          run = start;
        }
      }
      end = run;
    }
    return in.slice(begin, std::max(begin, end));
  }

 private:
  bool left_, right_;
};

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> stages) : stages_(std::move(stages)) {}
  Normalized normalize(Normalized in) const override {
    for (const auto& stage : stages_) in = stage->normalize(std::move(in));
    return in;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> stages_;
};

const icu::Normalizer2* icu_form(const std::string& type, const Source& where) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* form = type == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                                 : type == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                                 : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                                                  : icu::Normalizer2::getNFKDInstance(status);
  if (U_FAILURE(status)) fail(where, fmt::format("ICU has no {} normalizer: {}", type, u_errorName(status)));
  return form;
}

// BertNormalizer's switches, each on by default as in tokenizers.
struct BertOptions {
  bool clean_text = true;            ///< control characters dropped, every whitespace character ' '
  bool handle_chinese_chars = true;  ///< a space either side of each CJK ideograph: each its own word
  bool strip_accents = true;         ///< NFD, then nonspacing marks dropped (the file's null: = lowercase)
  bool lowercase = true;
};

// tokenizers' test of "Other" characters (Cc, Cf, Co; Cs cannot occur in UTF-8), tab, newline and
// carriage return excepted: they are whitespace. Its tables are Unicode 8.0's (in_unicode_8).
bool is_bert_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  const auto kind = u_charType(static_cast<UChar32>(c));
  return (kind == U_CONTROL_CHAR || kind == U_FORMAT_CHAR || kind == U_PRIVATE_USE_CHAR) && in_unicode_8(c);
}

// The CJK Unified Ideographs blocks of BERT's original tokenizer, as tokenizers copies them (so
// 0x2B820-0x2B91F is missed and 0x2B920 starts the next range, as there). Hangul and kana are
// not among them: those words stay whole.
bool is_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// BERT's BasicTokenizer cleanup, its stages in tokenizers' order. Accents are stripped before lower
// casing, so "İ" (I with a dot above) becomes "i" and not "i" plus a combining dot.
class BertNormalizer : public Normalizer {
 public:
  BertNormalizer(BertOptions options, const icu::Normalizer2* nfd) : options_(options), nfd_(nfd) {}

  Normalized normalize(Normalized in) const override {
    if (options_.clean_text) {
      in = map_code_points(in, [](char32_t c, const std::string& bytes) -> std::string {
        if (c == 0 || c == 0xfffd || is_bert_control(c)) return {};
        return c == '\t' || c == '\n' || c == '\r' || u_isUWhiteSpace(static_cast<UChar32>(c)) ? " " : bytes;
      });
    }
    if (options_.handle_chinese_chars) {
      in = map_code_points(in, [](char32_t c, const std::string& bytes) {
        return is_chinese_char(c) ? " " + bytes + " " : bytes;
      });
    }
    if (options_.strip_accents) {
      in = nfd_.normalize(std::move(in));
      in = map_code_points(in, [](char32_t c, const std::string& bytes) -> std::string {
        const bool mark = u_charType(static_cast<UChar32>(c)) == U_NON_SPACING_MARK && in_unicode_8(c);
        return mark ? std::string() : bytes;
      });
    }
    if (options_.lowercase) in = Lowercase().normalize(std::move(in));
    return in;
  }

 private:
  BertOptions options_;
  UnicodeForm nfd_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const Source& where) {
  if (!j.is_object()) fail(where, "a normalizer must be an object");
  const auto type = string_field(j, "type", where);
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    return std::make_unique<UnicodeForm>(icu_form(type, where));
  }
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Prepend") return std::make_unique<Prepend>(string_field(j, "prepend", where));
  if (type == "Replace") {
    return std::make_unique<Replace>(Pattern(j.value("pattern", nlohmann::json()), where.at("pattern")),
                                     string_field(j, "content", where));
  }
  if (type == "Strip") return std::make_unique<Strip>(j.value("strip_left", true), j.value("strip_right", true));
  if (type == "BertNormalizer") {
    BertOptions options;
    options.clean_text = bool_field(j, "clean_text", true, where);
    options.handle_chinese_chars = bool_field(j, "handle_chinese_chars", true, where);
    options.lowercase = bool_field(j, "lowercase", true, where);
    options.strip_accents = bool_field(j, "strip_accents", options.lowercase, where);
    return std::make_unique<BertNormalizer>(options, icu_form("NFD", where));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> stages;
    for (const auto& [item, source] : sequence_items(j, "normalizers", where)) stages.push_back(make_normalizer(*item, source));
    return std::make_unique<Sequence>(std::move(stages));
  }
  fail(where, fmt::format("unsupported normalizer '{}' (supported: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, "
                          "Replace, Strip, BertNormalizer, Sequence)",
                          type));
}

}  // namespace torchpatch::text
