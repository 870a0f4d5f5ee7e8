// Unicode character classes for the pre-tokenizer scanners: \p{L}, \p{N} and \s
// (the White_Space property), from generated range tables (unicode_tables.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

namespace gk::text::unicode {

struct CodeRange {
  uint32_t lo, hi;
};
extern const CodeRange kLetterRanges[];
extern const size_t kLetterRanges_size;
extern const CodeRange kNumberRanges[];
extern const size_t kNumberRanges_size;

enum Class : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

// The class of a code point (anything outside 0..0x10FFFF is kOther).
Class classify(uint32_t cp);

inline bool is_space(uint32_t cp) { return classify(cp) == kSpace; }

}  // namespace gk::text::unicode
