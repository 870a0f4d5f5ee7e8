#include "text/unicode.h"

#include <vector>

namespace gk::text::unicode {
namespace {

bool in(const CodeRange* r, size_t n, uint32_t cp) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (r[mid].hi < cp) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && r[lo].lo <= cp && cp <= r[lo].hi;
}

bool white_space(uint32_t cp) {
  return (cp >= 0x9 && cp <= 0xD) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

Class slow(uint32_t cp) {
  if (white_space(cp)) return kSpace;
  if (in(kLetterRanges, kLetterRanges_size, cp)) return kLetter;
  if (in(kNumberRanges, kNumberRanges_size, cp)) return kNumber;
  return kOther;
}

// Basic Multilingual Plane lookup table, built once (thread-safe static init).
const std::vector<uint8_t>& bmp() {
  static const std::vector<uint8_t> t = [] {
    std::vector<uint8_t> v(0x10000);
    for (uint32_t cp = 0; cp < 0x10000; ++cp) v[cp] = slow(cp);
    return v;
  }();
  return t;
}

}  // namespace

Class classify(uint32_t cp) {
  if (cp < 0x10000) return Class(bmp()[cp]);
  if (cp > 0x10FFFF) return kOther;
  return slow(cp);
}

}  // namespace gk::text::unicode
