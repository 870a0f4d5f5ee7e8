// Generation: prefill of the prompts, then one decode step per token for the
// sequences still running, sampling through gk::sampling::decode_step (greedy when
// temperature <= 0). Stops on EOS ids, stop ids, or max_new_tokens. The CUDA graph
// capture of the decode step is later work: each step runs eagerly.
#include <algorithm>
#include <cmath>

#include "gpukit/errors.h"
#include "gpukit/sampling.h"
#include "llm/internal.h"

namespace gk::llm {

void validate(const GenerateOptions& o) {
  if (o.max_new_tokens < 0) throw ValueError(cat("max_new_tokens: must be >= 0, got ", o.max_new_tokens));
  if (std::isnan(o.temperature) || std::isinf(o.temperature))
    throw ValueError(cat("temperature: must be a finite number, got ", o.temperature));
  if (o.top_k < 0) throw ValueError(cat("top_k: must be >= 0 (0: off), got ", o.top_k));
  if (!(o.top_p > 0.0 && o.top_p <= 1.0)) throw ValueError(cat("top_p: must be in (0, 1], got ", o.top_p));
}

void Generation::check_prompts() const {
  const ModelConfig& c = m_->config();
  if (prompts_.empty()) throw ValueError("prompts: no prompts given");
  for (size_t b = 0; b < prompts_.size(); ++b) {
    if (prompts_[b].empty()) throw ValueError(cat("prompt ", b, " is empty"));
    const int64_t prefix = cache_ ? cache_->length(seqs_[b]) : 0;
    if (prefix + int64_t(prompts_[b].size()) > c.max_positions)
      throw ValueError(cat("prompt ", b, " has ", prefix + int64_t(prompts_[b].size()),
                           " tokens, more than the model's context of ", c.max_positions));
    for (int32_t t : prompts_[b])
      if (t < 0 || t >= c.vocab_size)
        throw ValueError(cat("prompt ", b, ": token id ", t, " is outside the vocabulary [0, ", c.vocab_size, ")"));
  }
}

Generation::Generation(std::shared_ptr<Model> model, const std::vector<std::vector<int32_t>>& prompts,
                       const GenerateOptions& o)
    : m_(std::move(model)), o_(o), prompts_(prompts) {
  validate(o);
  check_prompts();
  const ModelConfig& c = m_->config();
  std::vector<int64_t> lengths;
  for (auto& p : prompts)
    lengths.push_back(std::min<int64_t>(int64_t(p.size()) + o.max_new_tokens, c.max_positions));
  cache_ = std::make_shared<KvCache>(m_->make_cache(lengths));
  for (size_t b = 0; b < prompts.size(); ++b) seqs_.push_back(cache_->add_sequence());
  out_.resize(prompts.size());
  reason_.assign(prompts.size(), o.max_new_tokens == 0 ? "length" : "");
}

Generation::Generation(std::shared_ptr<Model> model, std::shared_ptr<KvCache> cache, const std::vector<int64_t>& seqs,
                       const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& o)
    : m_(std::move(model)), o_(o), prompts_(prompts), seqs_(seqs), cache_(std::move(cache)) {
  validate(o);
  if (!cache_) throw ValueError("cache: no KV cache given");
  if (seqs.size() != prompts.size())
    throw ValueError(cat("seqs: ", seqs.size(), " sequences but ", prompts.size(), " prompts"));
  check_prompts();
  out_.resize(prompts.size());
  reason_.assign(prompts.size(), o.max_new_tokens == 0 ? "length" : "");
}

bool Generation::done() const {
  return std::all_of(reason_.begin(), reason_.end(), [](const std::string& r) { return !r.empty(); });
}

void Generation::finish(size_t row) {
  if (row < reason_.size() && reason_[row].empty()) reason_[row] = "stop";
}

std::vector<int32_t> Generation::step() {
  const size_t B = prompts_.size();
  std::vector<int32_t> result(B, -1);
  if (done()) return result;
  const ModelConfig& c = m_->config();
  std::vector<size_t> rows;
  std::vector<int64_t> seqs;
  std::vector<std::vector<int32_t>> toks;
  for (size_t b = 0; b < B; ++b) {
    if (!reason_[b].empty()) continue;
    if (started_ && cache_->length(seqs_[b]) >= c.max_positions) {
      reason_[b] = "length";
      continue;
    }
    rows.push_back(b);
    seqs.push_back(seqs_[b]);
    toks.push_back(started_ ? std::vector<int32_t>{out_[b].back()} : prompts_[b]);
  }
  if (rows.empty()) return result;
  Array logits = m_->step(*cache_, seqs, toks, false);  // [n, V] float32
  started_ = true;
  const int64_t n = int64_t(rows.size());
  Device d = logits.device();
  auto host = [&](DType t) { return Array::empty({n}, t, Device{}); };
  Array temp = host(DType::f32), topk = host(DType::i32), topp = host(DType::f32), seeds = host(DType::i64),
        pos = host(DType::i64);
  for (int64_t r = 0; r < n; ++r) {
    const size_t b = rows[size_t(r)];
    temp.data_as<float>()[r] = float(o_.temperature);
    topk.data_as<int32_t>()[r] = int32_t(std::min<int64_t>(o_.top_k, c.vocab_size));  // >= V: all tokens
    topp.data_as<float>()[r] = float(o_.top_p);
    // each sequence's stream of draws is keyed by (seed, its batch index) and the position
    seeds.data_as<int64_t>()[r] = int64_t(o_.seed * 1000003ull + b);
    pos.data_as<int64_t>()[r] = cache_->length(seqs_[b]);  // the position of the token drawn
  }
  sampling::Params p;
  p.temperature = temp.to(d);
  p.top_k = topk.to(d);
  p.top_p = topp.to(d);
  Array tokens = sampling::decode_step(logits, p, seeds.to(d), pos.to(d)).tokens.to(Device{});
  for (int64_t r = 0; r < n; ++r) {
    const size_t b = rows[size_t(r)];
    int32_t t = tokens.data_as<int32_t>()[r];
    out_[b].push_back(t);
    result[b] = t;
    bool eos = !o_.ignore_eos && std::find(c.eos_ids.begin(), c.eos_ids.end(), int64_t(t)) != c.eos_ids.end();
    if (eos) reason_[b] = "eos";
    else if (std::find(o_.stop_ids.begin(), o_.stop_ids.end(), t) != o_.stop_ids.end()) reason_[b] = "stop";
    else if (int64_t(out_[b].size()) >= o_.max_new_tokens || cache_->length(seqs_[b]) + 1 >= c.max_positions)
      reason_[b] = "length";  // a sequence never outgrows the context
  }
  return result;
}

std::vector<std::vector<int32_t>> generate(std::shared_ptr<Model> model,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& o) {
  Generation g(std::move(model), prompts, o);
  while (!g.done()) g.step();
  return g.generated();
}

}  // namespace gk::llm
