// Pre-tokenizer split patterns, as hand-written scanners with the exact semantics of
// the regular expressions they replace (leftmost alternative wins, greedy runs,
// backtracking of \s+(?!\S)):
//   GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   Llama-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   Qwen2:   the Llama-3 pattern with \p{N} instead of \p{N}{1,3}
//   Digits:  Hugging Face Digits(individual_digits) (numeric characters split out)
// Every scanner consumes at least one code point per match, so each step is linear.
#include <vector>

#include "text/tokenizer_impl.h"
#include "text/unicode.h"
#include "core/utf8.h"

namespace gk::text::detail {
namespace {
using unicode::Class;

struct Cps {
  std::vector<uint32_t> cp;
  std::vector<uint8_t> cls;
  std::vector<uint32_t> off;  // byte offset of each code point, plus the end
};

struct Scan {
  const Cps& c;
  size_t b;  // end of the piece being scanned (exclusive)
  bool is(size_t k, Class k_cls) const { return k < b && c.cls[k] == k_cls; }
  bool nl(size_t k) const { return k < b && (c.cp[k] == '\r' || c.cp[k] == '\n'); }
  size_t run(size_t k, Class k_cls) const {
    while (k < b && c.cls[k] == k_cls) ++k;
    return k;
  }
  // Length of a contraction at i ('s 't 're 've 'm 'll 'd), 0 if none.
  size_t contraction(size_t i, bool icase) const {
    if (c.cp[i] != '\'' || i + 1 >= b) return 0;
    auto low = [&](size_t k) -> uint32_t {
      uint32_t x = c.cp[k];
      if (icase) {
        if (x >= 'A' && x <= 'Z') x += 32;
        if (x == 0x17F) x = 's';  // LATIN SMALL LETTER LONG S case-folds to s
      }
      return x;
    };
    uint32_t x = low(i + 1);
    if (x == 's' || x == 't' || x == 'm' || x == 'd') return 2;
    if (i + 2 < b) {
      uint32_t y = low(i + 2);
      if ((x == 'r' && y == 'e') || (x == 'v' && y == 'e') || (x == 'l' && y == 'l')) return 3;
    }
    return 0;
  }
  // \s+(?!\S) followed by the \s+ fallback, from a whitespace code point at i.
  size_t spaces(size_t i) const {
    size_t k = run(i, unicode::kSpace);
    if (k == b || k - i < 2) return k;
    return k - 1;
  }
  size_t gpt2(size_t i) const {
    if (size_t n = contraction(i, false)) return i + n;
    bool sp = c.cp[i] == ' ';
    if (sp && is(i + 1, unicode::kLetter)) return run(i + 1, unicode::kLetter);
    if (is(i, unicode::kLetter)) return run(i, unicode::kLetter);
    if (sp && is(i + 1, unicode::kNumber)) return run(i + 1, unicode::kNumber);
    if (is(i, unicode::kNumber)) return run(i, unicode::kNumber);
    if (sp && is(i + 1, unicode::kOther)) return run(i + 1, unicode::kOther);
    if (is(i, unicode::kOther)) return run(i, unicode::kOther);
    return spaces(i);
  }
  size_t llama3(size_t i, size_t max_digits) const {
    if (size_t n = contraction(i, true)) return i + n;
    Class k = Class(c.cls[i]);
    if (k != unicode::kLetter && k != unicode::kNumber && !nl(i) && is(i + 1, unicode::kLetter))
      return run(i + 1, unicode::kLetter);
    if (k == unicode::kLetter) return run(i, unicode::kLetter);
    if (k == unicode::kNumber) {
      size_t j = i;
      while (j < b && j - i < max_digits && c.cls[j] == unicode::kNumber) ++j;
      return j;
    }
    size_t j = 0;
    if (c.cp[i] == ' ' && is(i + 1, unicode::kOther)) j = run(i + 1, unicode::kOther);
    else if (k == unicode::kOther) j = run(i, unicode::kOther);
    if (j) {
      while (nl(j)) ++j;
      return j;
    }
    // whitespace: \s*[\r\n]+ ends after the last CR/LF of the run
    size_t e = run(i, unicode::kSpace);
    for (size_t m = e; m > i; --m)
      if (c.cp[m - 1] == '\r' || c.cp[m - 1] == '\n') return m;
    return spaces(i);
  }
};

template <class Emit>
void split(const std::vector<PreStep>& steps, size_t level, const Cps& c, size_t a, size_t b, Emit& emit) {
  if (a >= b) return;
  if (level == steps.size()) {
    emit(a, b);
    return;
  }
  PreStep st = steps[level];
  Scan s{c, b};
  size_t i = a;
  while (i < b) {
    size_t j;
    switch (st) {
      case PreStep::Gpt2: j = s.gpt2(i); break;
      case PreStep::Llama3: j = s.llama3(i, 3); break;
      case PreStep::Qwen2: j = s.llama3(i, 1); break;
      case PreStep::DigitsIndividual:
        j = c.cls[i] == unicode::kNumber ? i + 1 : [&] {
          size_t k = i;
          while (k < b && c.cls[k] != unicode::kNumber) ++k;
          return k;
        }();
        break;
      case PreStep::DigitsGrouped: {
        bool num = c.cls[i] == unicode::kNumber;
        j = i;
        while (j < b && (c.cls[j] == unicode::kNumber) == num) ++j;
        break;
      }
      default: j = b;
    }
    if (j <= i) j = i + 1;  // defensive: always progress
    split(steps, level + 1, c, i, j, emit);
    i = j;
  }
}

}  // namespace

void pretokenize(const std::vector<PreStep>& steps, std::string_view text,
                 const std::function<void(size_t, size_t)>& emit) {
  if (steps.empty()) {
    if (!text.empty()) emit(0, text.size());
    return;
  }
  Cps c;
  c.cp.reserve(text.size());
  c.cls.reserve(text.size());
  c.off.reserve(text.size() + 1);
  auto* s = reinterpret_cast<const uint8_t*>(text.data());
  size_t i = 0, n = text.size();
  while (i < n) {
    uint32_t cp;
    bool ok;
    size_t k = s[i] < 0x80 ? (cp = s[i], ok = true, 1) : utf8::decode(s + i, n - i, &cp, &ok);
    c.off.push_back(uint32_t(i));
    c.cp.push_back(cp);
    c.cls.push_back(unicode::classify(cp));
    i += k;
  }
  c.off.push_back(uint32_t(n));
  auto to_bytes = [&](size_t a, size_t b) { emit(c.off[a], c.off[b]); };
  split(steps, 0, c, 0, c.cp.size(), to_bytes);
}

}  // namespace gk::text::detail
