// Normalizers: NFC, NFD, NFKC, NFKD (ICU), Lowercase, Prepend, Replace, Strip, Sequence.
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
    } else {
      out.append(utf8, in.origin_of(begin, end));
    }
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
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> stages;
    for (const auto& [item, source] : sequence_items(j, "normalizers", where)) stages.push_back(make_normalizer(*item, source));
    return std::make_unique<Sequence>(std::move(stages));
  }
  fail(where, fmt::format("unsupported normalizer '{}' (supported: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, "
                          "Replace, Strip, Sequence)",
                          type));
}

}  // namespace torchpatch::text
