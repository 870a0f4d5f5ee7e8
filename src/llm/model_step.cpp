// The KV cache's page bookkeeping and the model's entry points (src/llm/model.cpp has the
// layers): prefill (several tokens per sequence, after an optional cached prefix), decode
// (one token per sequence; decode_batch: the graph-capturable device-input form), step
// (validates and picks one of the two) and forward.
#include <algorithm>
#include <optional>

#include "gpukit/errors.h"
#include "gpukit/ops.h"
#include "llm/fused.h"
#include "llm/internal.h"

namespace gk::llm {

namespace {
Array i32_array(const std::vector<int32_t>& v) {
  Array a = Array::empty({int64_t(v.size())}, DType::i32, Device{});
  std::copy(v.begin(), v.end(), a.data_as<int32_t>());
  return a;
}
}  // namespace

// ---- KV cache ----

KvCache::KvCache(const ModelConfig& c, int64_t num_blocks, int64_t block_size, Device device, DType dtype)
    : bs_(block_size) {
  if (block_size < 16 || block_size > 256) throw ValueError(cat("block_size: must be in [16, 256], got ", block_size));
  if (num_blocks <= 0 || num_blocks > INT32_MAX) throw ValueError(cat("num_blocks: must be positive, got ", num_blocks));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    k.push_back(Array::empty({num_blocks, block_size, c.num_kv_heads, c.head_dim}, dtype, device));
    v.push_back(Array::empty({num_blocks, block_size, c.num_kv_heads, c.head_dim}, dtype, device));
  }
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(int32_t(b));
}

int64_t KvCache::add_sequence() {
  int64_t id = next_id_++;
  pages_[id];
  len_[id] = 0;
  return id;
}

void KvCache::release(int64_t seq) {
  auto it = pages_.find(seq);
  if (it == pages_.end()) return;
  for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) free_.push_back(*b);
  pages_.erase(it);
  len_.erase(seq);
}

int64_t KvCache::length(int64_t seq) const {
  auto it = len_.find(seq);
  if (it == len_.end()) throw IndexError(cat("KV cache: no sequence ", seq));
  return it->second;
}

void KvCache::reserve(int64_t seq, int64_t length) {
  auto& p = pages_.at(seq);
  const int64_t need = (length + bs_ - 1) / bs_;
  if (need - int64_t(p.size()) > int64_t(free_.size()))
    throw ValueError(cat("KV cache: out of pages (sequence needs ", need, " blocks of ", bs_, " tokens, ",
                         free_.size(), " free)"));
  while (int64_t(p.size()) < need) {
    p.push_back(free_.back());
    free_.pop_back();
  }
}

void KvCache::advance(int64_t seq, int64_t n) { len_.at(seq) += n; }

void KvCache::truncate(int64_t seq, int64_t length) {
  int64_t& n = len_.at(seq);
  if (length < 0 || length > n) throw ValueError(cat("truncate: length ", length, " outside [0, ", n, "]"));
  n = length;
}

int64_t KvCache::capacity(int64_t seq) const {
  return (int64_t(free_.size()) + int64_t(pages_.at(seq).size())) * bs_;
}

Array KvCache::block_table(const std::vector<int64_t>& seqs) const {
  size_t maxb = 1;
  for (int64_t s : seqs) maxb = std::max(maxb, pages_.at(s).size());
  Array t = Array::empty({int64_t(seqs.size()), int64_t(maxb)}, DType::i32, Device{});
  int32_t* p = t.data_as<int32_t>();
  for (size_t b = 0; b < seqs.size(); ++b) {
    const auto& pg = pages_.at(seqs[b]);
    for (size_t j = 0; j < maxb; ++j) p[b * maxb + j] = j < pg.size() ? pg[j] : 0;
  }
  return t;
}

// ---- entry points ----

void Model::set_attention_stamps(int layer) {
  stamps_layer_ = layer < 0 ? -1 : layer;
  if (stamps_layer_ >= 0 && device_.is_cuda()) {  // zeros (one buffer for the model's life: graphs keep it)
    Array z = Array::empty({512, 8}, DType::i64, Device{});
    std::fill_n(z.data_as<int64_t>(), 512 * 8, int64_t(0));
    if (!stamps_.defined()) stamps_ = z.to(device_);
    else copy_into(stamps_, z.to(device_));
  }
}

Array Model::prefill(KvCache& cache, const std::vector<int64_t>& seqs, const std::vector<std::vector<int32_t>>& tokens,
                     bool all_logits) {
  // Several new tokens per sequence, after an (optional) cached prefix of length L_b:
  // queries at positions L_b .. L_b + T_b - 1, causal and bottom-right aligned over
  // keys 0 .. L_b + T_b - 1. With a prefix, each layer gathers the sequence's keys
  // and values from its pages (one embedding gather over the token slots).
  const size_t B = seqs.size();
  const int64_t bs = cache.block_size();
  std::vector<int32_t> ids, pos, cu_q{0}, cu_k{0}, last, lens;
  bool any_prefix = false;
  for (size_t b = 0; b < B; ++b) {
    const int64_t L = cache.length(seqs[b]);
    any_prefix = any_prefix || L > 0;
    lens.push_back(int32_t(L));
    for (size_t j = 0; j < tokens[b].size(); ++j) {
      ids.push_back(tokens[b][j]);
      pos.push_back(int32_t(L + int64_t(j)));
    }
    cu_q.push_back(int32_t(ids.size()));
    cu_k.push_back(cu_k.back() + int32_t(L + int64_t(tokens[b].size())));
    last.push_back(int32_t(ids.size()) - 1);
    cache.reserve(seqs[b], L + int64_t(tokens[b].size()));
  }
  nn::KvIndex idx;
  idx.block_table = cache.block_table(seqs);
  idx.seq_lens = i32_array(lens);
  idx.cu_seqlens = i32_array(cu_q);
  Array cq = idx.cu_seqlens, ck = i32_array(cu_k);
  std::vector<int32_t> slots;
  if (any_prefix) {
    const int64_t nb = idx.block_table.shape(1);
    const int32_t* bt = idx.block_table.data_as<int32_t>();
    for (size_t b = 0; b < B; ++b)
      for (int64_t p = 0; p < cu_k[b + 1] - cu_k[b]; ++p) slots.push_back(int32_t(bt[int64_t(b) * nb + p / bs] * bs + p % bs));
  }
  Array slot_ids = any_prefix ? i32_array(slots) : Array();
  const ModelConfig& c = cfg_;
  std::optional<int64_t> window;
  if (cfg_.sliding_window > 0) window = cfg_.sliding_window;
  auto attend = [&](const Array& q, const Array& k, const Array& v, int l) {
    if (!any_prefix) return nn::attention_prefill(q, k, v, cq, cq, /*causal=*/true, std::nullopt, window);
    const Array& kc = cache.k[size_t(l)];
    const int64_t rows = kc.shape(0) * kc.shape(1), S = int64_t(slots.size());
    Array kk = embedding(slot_ids, kc.reshape({rows, c.num_kv_heads * c.head_dim})).reshape({S, c.num_kv_heads, c.head_dim});
    Array vv = embedding(slot_ids, cache.v[size_t(l)].reshape({rows, c.num_kv_heads * c.head_dim}))
                   .reshape({S, c.num_kv_heads, c.head_dim});
    return nn::attention_prefill(q, kk, vv, cq, ck, /*causal=*/true, std::nullopt, window);
  };
  Array h = run_layers(i32_array(ids), i32_array(pos), cache, idx, attend);
  for (size_t b = 0; b < B; ++b) cache.advance(seqs[b], int64_t(tokens[b].size()));
  if (!all_logits) h = embedding(i32_array(last), h);
  return lm_head(h);
}

Array Model::decode_batch(KvCache& cache, const DecodeBatch& in, const Array& argmax_keys) {
  nn::KvIndex idx;
  idx.block_table = in.block_table;
  idx.seq_lens = in.positions;  // lengths before the append
  std::optional<int64_t> window;
  if (cfg_.sliding_window > 0) window = cfg_.sliding_window;
  auto attend = [&](const Array& q, const Array&, const Array&, int l) {
    return nn::attention_decode(q, cache.k[size_t(l)], cache.v[size_t(l)], in.lengths, in.block_table, std::nullopt,
                                window);
  };
  struct Flag {  // engine kernels for this step (EngineOptions::fusion)
    bool& f;
    explicit Flag(bool& x) : f(x) { f = true; }
    ~Flag() { f = false; }
  } flag(decoding_);
  const bool quant = !w_.quantized.empty();
  const bool qpdl = opt_.quantized_pdl || (opt_.quantized_pdl_fp8 && w_.quantized == "fp8");
  fused::NoPdlScope no_pdl(!qpdl && quant);
  fused::SmallPdlScope small_pdl(!qpdl && quant ? opt_.quantized_small_pdl : 0);
  fused::CarveoutScope carve(opt_.carveout);
  fused::EvictFirstScope wef(opt_.weights_evict_first && !quant);
  fused::AttnMmaScope amma(opt_.fused_attention_mma, opt_.fused_attention_pad_kb, push_merge(opt_, cfg_, w_));
  fused::AttnEarlyScope aearly(opt_.fused_attention_early_rope);
  // -1: 2 with int4 weights, else by the grid (fused::AttnWideScope)
  fused::AttnWideScope awide(opt_.fused_attention_wide < 0 && w_.quantized == "int4" ? 2 : opt_.fused_attention_wide);
  fused::OProjStageScope ostage(opt_.o_proj_stage);
  fused::W8FullRingScope fullring(quant ? opt_.quantized_full_ring : 0);
  fused::GridCapScope cap(quant && qpdl && opt_.quantized_pdl_compact ? 4 : 0);
  Array h = run_layers(in.ids, in.positions, cache, idx, attend);
  if (argmax_keys.defined() && !head_argmax(h.shape(0)))
    throw ValueError("decode_batch: argmax_keys given but the lm head cannot fold the argmax in");
  Array logits = lm_head(h, &argmax_keys);
  xprep_h_ = xprep_xh_ = xprep_inv_ = Array();  // quantized_x_prep: held for the lm head only
  mark("lm_head", -1);
  join_side_branch();
  return logits;
}

Array Model::decode(KvCache& cache, const std::vector<int64_t>& seqs, const std::vector<int32_t>& tokens) {
  const size_t B = seqs.size();
  std::vector<int32_t> pos, lens_after;
  for (size_t b = 0; b < B; ++b) {
    int64_t n = cache.length(seqs[b]);
    cache.reserve(seqs[b], n + 1);
    pos.push_back(int32_t(n));
    lens_after.push_back(int32_t(n + 1));
  }
  DecodeBatch in;
  in.ids = i32_array(tokens).to(device_, nullptr, true);
  in.positions = i32_array(pos).to(device_, nullptr, true);
  in.lengths = i32_array(lens_after).to(device_, nullptr, true);
  in.block_table = cache.block_table(seqs).to(device_, nullptr, true);
  Array logits = decode_batch(cache, in);
  for (size_t b = 0; b < B; ++b) cache.advance(seqs[b], 1);
  return logits;
}

Array Model::step(KvCache& cache, const std::vector<int64_t>& seqs, const std::vector<std::vector<int32_t>>& tokens,
                  bool all_logits) {
  if (seqs.size() != tokens.size() || seqs.empty())
    throw ValueError(cat("step: ", seqs.size(), " sequences but ", tokens.size(), " token lists"));
  {
    std::vector<int64_t> sorted = seqs;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      throw ValueError("seqs: a sequence appears twice in one step");
  }
  bool all_new = true, all_one = true;  // all_new: every sequence starts empty
  for (size_t b = 0; b < seqs.size(); ++b) {
    if (tokens[b].empty()) throw ValueError(cat("tokens: sequence ", b, " is empty (an empty prompt?)"));
    const int64_t len = cache.length(seqs[b]);
    if (len + int64_t(tokens[b].size()) > cfg_.max_positions)
      throw ValueError(cat("tokens: sequence ", b, " would hold ", len + int64_t(tokens[b].size()),
                           " tokens, more than the model's context of ", cfg_.max_positions));
    for (int32_t t : tokens[b])
      if (t < 0 || t >= cfg_.vocab_size)
        throw IndexError(cat("tokens: id ", t, " is outside the vocabulary [0, ", cfg_.vocab_size, ")"));
    all_new = all_new && len == 0;
    all_one = all_one && tokens[b].size() == 1;
  }
  if (all_one && !all_new) {
    std::vector<int32_t> t;
    for (auto& x : tokens) t.push_back(x[0]);
    return decode(cache, seqs, t);
  }
  return prefill(cache, seqs, tokens, all_logits);  // fresh prompts and/or chunks after a cached prefix
}

Array Model::forward(const std::vector<int32_t>& ids) {
  if (ids.empty()) throw ValueError("ids: empty input");
  KvCache cache = make_cache({int64_t(ids.size())});
  int64_t s = cache.add_sequence();
  return step(cache, {s}, {ids}, true);
}

}  // namespace gk::llm
