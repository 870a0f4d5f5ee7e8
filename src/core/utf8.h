// UTF-8 helpers shared by the file readers and the tokenizers. Decoding follows the Unicode "maximal subpart" rule for invalid
// input (the same U+FFFD substitutions as Python's bytes.decode('utf-8', 'replace')).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gk::utf8 {

inline void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// Decodes one code point at s[0..n) (n > 0). Returns the number of bytes consumed:
// for a well-formed sequence its length and *cp the code point; for an ill-formed one
// the length of its maximal subpart (>= 1) and *cp = 0xFFFD, *ok = false.
inline size_t decode(const uint8_t* s, size_t n, uint32_t* cp, bool* ok) {
  uint8_t c = s[0];
  *ok = true;
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  size_t len;
  uint8_t lo = 0x80, hi = 0xBF;
  uint32_t v;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    v = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    v = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    v = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    *ok = false;
    *cp = 0xFFFD;
    return 1;
  }
  size_t i = 1;
  for (; i < len; ++i) {
    if (i >= n) break;
    uint8_t b = s[i];
    uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
    v = (v << 6) | (b & 0x3F);
  }
  if (i < len) {
    *ok = false;
    *cp = 0xFFFD;
    return i;
  }
  *cp = v;
  return len;
}

// Length of the well-formed sequence at s (0 when ill-formed or truncated).
inline size_t valid_len(const uint8_t* s, size_t n) {
  uint32_t cp;
  bool ok;
  size_t k = decode(s, n, &cp, &ok);
  return ok ? k : 0;
}

// True when the whole string is well-formed UTF-8 (no overlongs, surrogates or
// code points past U+10FFFF).
inline bool valid(std::string_view in) {
  auto* s = reinterpret_cast<const uint8_t*>(in.data());
  for (size_t i = 0, n = in.size(); i < n;) {
    size_t k = valid_len(s + i, n - i);
    if (k == 0) return false;
    i += k;
  }
  return true;
}

// Replaces every ill-formed subsequence by U+FFFD.
inline std::string sanitize(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  auto* s = reinterpret_cast<const uint8_t*>(in.data());
  size_t i = 0, n = in.size();
  while (i < n) {
    if (s[i] < 0x80) {
      out += char(s[i++]);
      continue;
    }
    uint32_t cp;
    bool ok;
    size_t k = decode(s + i, n - i, &cp, &ok);
    if (ok) out.append(in.data() + i, k);
    else append(out, 0xFFFD);
    i += k;
  }
  return out;
}

inline bool is_valid(std::string_view in) {
  auto* s = reinterpret_cast<const uint8_t*>(in.data());
  size_t i = 0, n = in.size();
  while (i < n) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    size_t k = valid_len(s + i, n - i);
    if (!k) return false;
    i += k;
  }
  return true;
}

}  // namespace gk::utf8
