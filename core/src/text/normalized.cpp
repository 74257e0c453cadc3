#include "text/normalized.h"

namespace torchpatch::text {

char32_t next_code_point(const std::string& s, size_t& i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  int len = b0 < 0x80 ? 1 : (b0 >> 5) == 0x6 ? 2 : (b0 >> 4) == 0xe ? 3 : (b0 >> 3) == 0x1e ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    ++i;
    return 0xfffd;
  }
  char32_t c = len == 1 ? b0 : len == 2 ? (b0 & 0x1f) : len == 3 ? (b0 & 0x0f) : (b0 & 0x07);
  for (int k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) {
      ++i;
      return 0xfffd;
    }
    c = (c << 6) | (byte(i + k) & 0x3f);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
  const bool overlong = (len == 2 && c < 0x80) || (len == 3 && c < 0x800) || (len == 4 && c < 0x10000);
  if (overlong || (c >= 0xd800 && c <= 0xdfff) || c > 0x10ffff) {
    ++i;
    return 0xfffd;
  }
  i += len;
  return c;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xc0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xe0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  }
}

size_t invalid_utf8_at(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    if (next_code_point(s, i) == 0xfffd && !(i - start == 3 && s.compare(start, 3, "\xef\xbf\xbd") == 0)) return start;
  }
  return std::string::npos;
}

Normalized Normalized::original(const std::string& s, size_t offset) {
  Normalized n;
  n.text = s;
  n.origin.resize(s.size());
  // Every byte of a code point maps to the whole code point, so no range splits a character.
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    next_code_point(s, i);
    for (size_t k = start; k < i; ++k) n.origin[k] = {offset + start, offset + i};
  }
  return n;
}

Range Normalized::origin_of(size_t begin, size_t end) const {
  if (begin >= end || begin >= origin.size()) {
    const size_t at = begin < origin.size() ? origin[begin].first : origin.empty() ? 0 : origin.back().second;
    return {at, at};
  }
  return {origin[begin].first, origin[end - 1].second};
}

Normalized Normalized::slice(size_t begin, size_t end) const {
  Normalized n;
  n.text = text.substr(begin, end - begin);
  n.origin.assign(origin.begin() + static_cast<std::ptrdiff_t>(begin), origin.begin() + static_cast<std::ptrdiff_t>(end));
  return n;
}

void Normalized::append(const std::string& piece, Range from) {
  text += piece;
  origin.insert(origin.end(), piece.size(), from);
}

void Normalized::append(const Normalized& other, size_t begin, size_t end) {
  text.append(other.text, begin, end - begin);
  origin.insert(origin.end(), other.origin.begin() + static_cast<std::ptrdiff_t>(begin),
                other.origin.begin() + static_cast<std::ptrdiff_t>(end));
}

}  // namespace torchpatch::text
