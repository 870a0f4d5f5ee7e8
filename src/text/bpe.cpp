// BPE merge loops. Byte-level BPE: lowest merge rank first, leftmost on ties (the
// Hugging Face and llama.cpp order). SentencePiece BPE: highest score of the merged
// piece first, leftmost on ties (llama.cpp's order). Short words use an array scan
// (O(n) per merge with cached pair ranks); long ones a priority queue over a linked
// list (O(n log n)), so a 1 MiB pre-token costs well under a second.
#include <climits>
#include <queue>
#include <vector>

#include "text/tokenizer_impl.h"
#include "core/utf8.h"

namespace gk::text::detail {

uint32_t byte_to_cp(uint8_t b) {
  // Printable Latin-1 bytes map to themselves; the others to U+0100 + k in byte order.
  static const auto table = [] {
    std::vector<uint32_t> t(256);
    uint32_t k = 0;
    for (int c = 0; c < 256; ++c) {
      bool keep = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
      t[c] = keep ? uint32_t(c) : 0x100 + k++;
    }
    return t;
  }();
  return table[b];
}

std::string byte_symbol(uint8_t b) {
  std::string s;
  utf8::append(s, byte_to_cp(b));
  return s;
}

int byte_from_cp(uint32_t cp) {
  static const auto table = [] {
    std::vector<int16_t> t(0x144, -1);
    for (int b = 0; b < 256; ++b) t[byte_to_cp(uint8_t(b))] = int16_t(b);
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

namespace {

void merge_short(const PairTable& merges, std::vector<int32_t>& s, std::vector<int32_t>& out) {
  size_t n = s.size();
  int32_t rank[64], merged[64];
  auto look = [&](size_t i) {
    if (!merges.find(s[i], s[i + 1], &rank[i], &merged[i])) rank[i] = INT_MAX;
  };
  for (size_t i = 0; i + 1 < n; ++i) look(i);
  while (n >= 2) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == INT_MAX) break;
    s[best] = merged[best];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      s[i] = s[i + 1];
      rank[i] = rank[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) look(best - 1);
    if (best + 1 < n) look(best);
  }
  out.insert(out.end(), s.begin(), s.begin() + n);
}

struct Cand {
  int32_t rank, pos, merged;
  bool operator<(const Cand& o) const {  // priority_queue is a max-heap: invert
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

void merge_long(const PairTable& merges, std::vector<int32_t>& s, std::vector<int32_t>& out) {
  const int32_t n = int32_t(s.size());
  std::vector<int32_t> prev(n), next(n);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  // Build the initial heap in O(n) instead of n pushes.
  std::vector<Cand> init;
  init.reserve(size_t(n));
  for (int32_t i = 0; i + 1 < n; ++i) {
    int32_t r, m;
    if (merges.find(s[i], s[i + 1], &r, &m)) init.push_back({r, i, m});
  }
  std::priority_queue<Cand> q(std::less<Cand>(), std::move(init));
  auto push = [&](int32_t i) {
    if (i < 0 || next[i] < 0) return;
    int32_t r, m;
    if (merges.find(s[i], s[next[i]], &r, &m)) q.push({r, i, m});
  };
  while (!q.empty()) {
    Cand c = q.top();
    q.pop();
    int32_t i = c.pos, j = next[i];
    if (s[i] < 0 || j < 0) continue;
    int32_t r, m;
    if (!merges.find(s[i], s[j], &r, &m) || r != c.rank || m != c.merged) continue;
    s[i] = m;
    s[j] = -1;  // removed
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    push(prev[i]);
    push(i);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = next[i]) out.push_back(s[i]);
}

}  // namespace

void bpe_merge_ids(const PairTable& merges, std::vector<int32_t>& syms, std::vector<int32_t>& out) {
  if (syms.size() <= 1) {
    out.insert(out.end(), syms.begin(), syms.end());
  } else if (syms.size() <= 64) {
    merge_short(merges, syms, out);
  } else {
    merge_long(merges, syms, out);
  }
}

namespace {
struct SpmSym {
  int32_t prev, next;
  uint32_t start, len;  // len 0: merged away
};
struct SpmCand {
  float score;
  int32_t left, right;
  uint32_t len;
  bool operator<(const SpmCand& o) const { return score != o.score ? score < o.score : left > o.left; }
};
}  // namespace

void spm_encode(const TokenizerImpl& t, std::string_view text, std::vector<int32_t>& out) {
  std::vector<SpmSym> sy;
  auto* s = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    bool ok;
    size_t k = utf8::decode(s + i, text.size() - i, &cp, &ok);
    int32_t idx = int32_t(sy.size());
    sy.push_back({idx - 1, -1, uint32_t(i), uint32_t(k)});
    if (idx > 0) sy[idx - 1].next = idx;
    i += k;
  }
  std::priority_queue<SpmCand> q;
  auto add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    uint32_t len = sy[l].len + sy[r].len;
    int32_t id = t.vocab.find(text.substr(sy[l].start, len));
    if (id < 0) return;
    q.push({t.scores[id], l, r, len});
  };
  for (int32_t i = 0; i + 1 < int32_t(sy.size()); ++i) add(i, i + 1);
  while (!q.empty()) {
    SpmCand c = q.top();
    q.pop();
    SpmSym &L = sy[c.left], &R = sy[c.right];
    if (L.len == 0 || R.len == 0 || L.next != c.right || L.len + R.len != c.len) continue;
    L.len += R.len;
    R.len = 0;
    L.next = R.next;
    if (R.next >= 0) sy[R.next].prev = c.left;
    add(L.prev, c.left);
    add(c.left, L.next);
  }
  for (int32_t i = sy.empty() ? -1 : 0; i >= 0; i = sy[i].next) {
    std::string_view piece = text.substr(sy[i].start, sy[i].len);
    int32_t id = t.vocab.find(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (unsigned char b : piece) {
      if (t.byte_ids[b] >= 0) out.push_back(t.byte_ids[b]);
      else if (t.unk_id >= 0) out.push_back(t.unk_id);
    }
  }
}

}  // namespace gk::text::detail
