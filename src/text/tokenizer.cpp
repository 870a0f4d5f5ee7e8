// Tokenizer: special-token splitting, encode, decode, streaming decode, lookup tables.
#include <algorithm>
#include <fstream>
#include <sstream>

#include "gpukit/errors.h"
#include "text/tokenizer_impl.h"
#include "text/unicode.h"
#include "core/utf8.h"

namespace gk::text {
namespace detail {

// ---- tables ----
void StrTable::build(const std::vector<std::pair<std::string_view, int32_t>>& items) {
  size_t cap = 16;
  while (cap < items.size() * 2 + 1) cap <<= 1;
  keys_.assign(cap, std::string_view());
  vals_.assign(cap, -1);
  mask_ = cap - 1;
  std::hash<std::string_view> h;
  for (auto& [k, v] : items) {
    for (size_t i = h(k) & mask_;; i = (i + 1) & mask_) {
      if (vals_[i] < 0) {
        keys_[i] = k;
        vals_[i] = v;
        break;
      }
      if (keys_[i] == k) break;  // first wins
    }
  }
}

int32_t StrTable::find(std::string_view key) const {
  if (vals_.empty()) return -1;
  std::hash<std::string_view> h;
  for (size_t i = h(key) & mask_;; i = (i + 1) & mask_) {
    if (vals_[i] < 0) return -1;
    if (keys_[i] == key) return vals_[i];
  }
}

void PairTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2 + 1) cap <<= 1;
  slots_.assign(cap, Slot());
  mask_ = cap - 1;
  count_ = 0;
}

bool PairTable::insert(int32_t a, int32_t b, int32_t rank, int32_t merged) {
  if ((count_ + 1) * 2 > slots_.size()) {  // grow
    std::vector<Slot> old = std::move(slots_);
    reserve(std::max<size_t>(16, old.size()));
    for (auto& s : old)
      if (s.k != kEmpty) insert(int32_t(s.k >> 32), int32_t(uint32_t(s.k)), s.rank, s.merged);
  }
  uint64_t k = key(a, b);
  for (size_t h = mix(k) & mask_;; h = (h + 1) & mask_) {
    Slot& s = slots_[h];
    if (s.k == k) return false;
    if (s.k == kEmpty) {
      s = {k, rank, merged};
      ++count_;
      return true;
    }
  }
}

void TokenizerImpl::finalize() {
  const size_t n = id_to_token.size();
  special.resize(n, 0);
  id_bytes.assign(n, std::string());
  std::vector<std::pair<std::string_view, int32_t>> items, bytes_items;
  items.reserve(n);
  // Added tokens take precedence for their content.
  for (auto& a : added) items.emplace_back(id_to_token[a.id], a.id);
  for (size_t i = 0; i < n; ++i) {
    const std::string& tok = id_to_token[i];
    if (!tok.empty() || model == Model::SpmBPE) items.emplace_back(tok, int32_t(i));
    std::string& b = id_bytes[i];
    if (model == Model::ByteBPE) {
      auto* s = reinterpret_cast<const uint8_t*>(tok.data());
      bool all = true;
      for (size_t k = 0; k < tok.size();) {
        uint32_t cp;
        bool ok;
        k += utf8::decode(s + k, tok.size() - k, &cp, &ok);
        int v = ok ? byte_from_cp(cp) : -1;
        if (v < 0) {
          all = false;
          break;
        }
        b += char(v);
      }
      if (!all) b = tok;
    } else {
      b.clear();
      for (size_t k = 0; k < tok.size();) {
        if (tok.compare(k, 3, "\xE2\x96\x81") == 0) {
          b += ' ';
          k += 3;
        } else {
          b += tok[k++];
        }
      }
    }
  }
  for (int c = 0; c < 256; ++c) {  // SentencePiece byte tokens decode to their byte
    int32_t id = byte_ids[c];
    if (model == Model::SpmBPE && id >= 0) id_bytes[id] = std::string(1, char(c));
  }
  vocab.build(items);
  if (model == Model::ByteBPE && ignore_merges) {
    for (size_t i = 0; i < n; ++i) {
      if (special[i] || id_to_token[i].empty()) continue;
      // only tokens written entirely in the byte-level alphabet map back exactly
      bool exact = true;
      std::string re;
      for (unsigned char c : id_bytes[i]) utf8::append(re, byte_to_cp(c));
      if (re != id_to_token[i]) exact = false;
      if (exact) bytes_items.emplace_back(id_bytes[i], int32_t(i));
    }
    bytes_vocab.build(bytes_items);
  }
  build_trie(*this);
}

void TokenizerImpl::encode_segment(std::string_view seg, bool first_segment, bool after_special,
                                   std::vector<int32_t>& out) const {
  if (model == Model::SpmBPE) {
    std::string esc;
    esc.reserve(seg.size() + 8);
    if (add_space_prefix && after_special) esc += "\xE2\x96\x81";
    for (char c : seg) {
      if (c == ' ') esc += "\xE2\x96\x81";
      else esc += c;
    }
    spm_encode(*this, esc, out);
    return;
  }
  std::string tmp;
  if (add_prefix_space && (seg.empty() || seg[0] != ' ')) {
    tmp.reserve(seg.size() + 1);
    tmp += ' ';
    tmp += seg;
    seg = tmp;
  }
  std::vector<int32_t> syms;
  pretokenize(pre_steps, seg, [&](size_t a, size_t b) {
    std::string_view piece = seg.substr(a, b - a);
    if (ignore_merges) {
      int32_t id = bytes_vocab.find(piece);
      if (id >= 0) {
        out.push_back(id);
        return;
      }
    }
    syms.clear();
    for (unsigned char c : piece) {
      int32_t id = byte_ids[c];
      if (id >= 0) syms.push_back(id);
      else if (unk_id >= 0) syms.push_back(unk_id);
    }
    bpe_merge_ids(merges, syms, out);
  });
}

namespace {
}  // namespace

bool space_before(std::string_view t, size_t lo, size_t i, size_t* start) {
  if (i <= lo) return false;
  size_t k = i - 1;
  while (k > lo && (uint8_t(t[k]) & 0xC0) == 0x80 && i - k < 4) --k;
  uint32_t cp;
  bool ok;
  size_t n = utf8::decode(reinterpret_cast<const uint8_t*>(t.data()) + k, i - k, &cp, &ok);
  if (!ok || k + n != i || !unicode::is_space(cp)) return false;
  *start = k;
  return true;
}

bool space_after(std::string_view t, size_t i, size_t* end) {
  if (i >= t.size()) return false;
  uint32_t cp;
  bool ok;
  size_t n = utf8::decode(reinterpret_cast<const uint8_t*>(t.data()) + i, t.size() - i, &cp, &ok);
  if (!ok || !unicode::is_space(cp)) return false;
  *end = i + n;
  return true;
}

void build_trie(TokenizerImpl& t) {
  t.trie.nodes.assign(1, Trie::Node());
  for (size_t a = 0; a < t.added.size(); ++a) {
    const std::string& c = t.added[a].content;
    if (c.empty()) continue;
    int32_t node = 0;
    for (unsigned char b : c) {
      int32_t k = t.trie.child(node, b);
      if (k < 0) {
        k = int32_t(t.trie.nodes.size());
        t.trie.nodes[node].kids.emplace_back(b, k);
        t.trie.nodes.emplace_back();
      }
      node = k;
    }
    if (t.trie.nodes[node].added < 0) t.trie.nodes[node].added = int32_t(a);
    t.trie.first[uint8_t(c[0])] = true;
  }
}

}  // namespace detail

using detail::TokenizerImpl;

namespace {

struct Seg {
  size_t a, b;
  int32_t id;  // -1: text
};

std::vector<Seg> split_added(const TokenizerImpl& t, std::string_view s) {
  std::vector<Seg> segs;
  const auto& tr = t.trie;
  size_t text_start = 0, i = 0;
  while (i < s.size()) {
    if (!tr.first[uint8_t(s[i])]) {
      ++i;
      continue;
    }
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t k = i; k < s.size(); ++k) {
      node = tr.child(node, uint8_t(s[k]));
      if (node < 0) break;
      if (tr.nodes[node].added >= 0) {
        best = tr.nodes[node].added;
        best_end = k + 1;
      }
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const auto& at = t.added[best];
    size_t a = i, b = best_end, x;
    if (at.lstrip)
      while (detail::space_before(s, text_start, a, &x)) a = x;
    if (at.rstrip)
      while (detail::space_after(s, b, &x)) b = x;
    if (a > text_start) segs.push_back({text_start, a, -1});
    segs.push_back({a, b, at.id});
    text_start = i = b;
  }
  if (text_start < s.size()) segs.push_back({text_start, s.size(), -1});
  return segs;
}

void check_id(const TokenizerImpl& t, int64_t id, size_t index) {
  if (id < 0 || id >= int64_t(t.id_to_token.size()))
    throw IndexError(cat("ids[", index, "]: token id ", id, " out of range [0, ", t.id_to_token.size(), ")"));
}

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens, bool parse_special) const {
  const TokenizerImpl& t = *impl_;
  if (text.size() > (size_t(1) << 31) - 16) throw ValueError("text: longer than 2 GiB");
  std::string clean;
  if (!utf8::is_valid(text)) {
    clean = utf8::sanitize(text);
    text = clean;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  if (add_special_tokens) out = t.prefix_ids;
  std::vector<Seg> segs;
  if (parse_special && !t.added.empty()) segs = split_added(t, text);
  else if (!text.empty()) segs.push_back({0, text.size(), -1});
  bool after_special = true, first = true;
  for (auto& s : segs) {
    if (s.id >= 0) {
      out.push_back(s.id);
      after_special = true;
    } else {
      t.encode_segment(text.substr(s.a, s.b - s.a), first, after_special, out);
      after_special = false;
    }
    first = false;
  }
  if (add_special_tokens) out.insert(out.end(), t.suffix_ids.begin(), t.suffix_ids.end());
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const TokenizerImpl& t = *impl_;
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    check_id(t, ids[i], i);
    if (skip_special_tokens && t.special[ids[i]]) continue;
    bytes += t.id_bytes[ids[i]];
  }
  if (t.strip_decoded_space && !bytes.empty() && bytes[0] == ' ') bytes.erase(0, 1);
  return utf8::sanitize(bytes);
}

std::string Tokenizer::token_bytes(int32_t id) const {
  check_id(*impl_, id, 0);
  return impl_->id_bytes[id];
}

int32_t Tokenizer::vocab_size() const { return int32_t(impl_->id_to_token.size()); }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  int32_t id = impl_->vocab.find(token);
  if (id < 0) return std::nullopt;
  return id;
}
const std::string& Tokenizer::id_to_token(int32_t id) const {
  check_id(*impl_, id, 0);
  return impl_->id_to_token[id];
}
bool Tokenizer::is_special(int32_t id) const {
  check_id(*impl_, id, 0);
  return impl_->special[id] != 0;
}
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
std::string Tokenizer::kind() const { return impl_->model == detail::Model::ByteBPE ? "bpe-bytelevel" : "bpe-spm"; }
std::string Tokenizer::pre_tokenizer() const { return impl_->pre_name; }

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json) {
  Tokenizer t;
  t.impl_ = detail::load_json(tokenizer_json, config_json);
  return t;
}

Tokenizer Tokenizer::from_gguf_data(const GGUFTokenizerData& data) {
  Tokenizer t;
  t.impl_ = detail::load_gguf_data(data);
  return t;
}

namespace {
bool read_file(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}
}  // namespace

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::string js, cfg;
  if (!read_file(path, &js)) throw ValueError(cat("path: cannot read '", path, "'"));
  auto slash = path.find_last_of('/');
  std::string dir = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  read_file(dir + "tokenizer_config.json", &cfg);
  return from_json(js, cfg);
}

// ---- streaming ----
StreamDecoder::StreamDecoder(Tokenizer tokenizer, bool skip_special_tokens)
    : tok_(std::move(tokenizer)), skip_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  const TokenizerImpl& t = tok_.impl();
  check_id(t, id, 0);
  if (skip_ && t.special[id]) return take(false);
  const std::string& b = t.id_bytes[id];
  size_t from = 0;
  if (first_ && !b.empty()) {
    if (t.strip_decoded_space && b[0] == ' ') from = 1;
    first_ = false;
  }
  pending_.append(b, from, std::string::npos);
  return take(false);
}

std::string StreamDecoder::push(const std::vector<int32_t>& ids) {
  for (size_t i = 0; i < ids.size(); ++i) check_id(tok_.impl(), ids[i], i);
  std::string out;
  for (int32_t id : ids) out += push(id);
  return out;
}

std::string StreamDecoder::flush() { return take(true); }

std::string StreamDecoder::take(bool final) {
  auto* s = reinterpret_cast<const uint8_t*>(pending_.data());
  size_t n = pending_.size(), i = 0;
  std::string out;
  while (i < n) {
    if (s[i] < 0x80) {
      out += char(s[i++]);
      continue;
    }
    uint32_t cp;
    bool ok;
    size_t k = utf8::decode(s + i, n - i, &cp, &ok);
    if (ok) {
      out.append(pending_, i, k);
    } else {
      bool lead = s[i] >= 0xC2 && s[i] <= 0xF4;
      if (!final && lead && i + k == n) break;  // an unfinished character: hold it back
      utf8::append(out, 0xFFFD);
    }
    i += k;
  }
  pending_.erase(0, i);
  if (final) {
    pending_.clear();
    first_ = true;
  }
  return out;
}

}  // namespace gk::text
