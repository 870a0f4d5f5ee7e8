// Generation: prefill of the prompts, then one decode step per token for the
// sequences still running, sampling through gk::sampling::decode_step (greedy when
// temperature <= 0). Stops on EOS ids, stop ids, or max_new_tokens. Decode steps run
// through a DecodeRunner (decode.cpp): a CUDA graph replayed per token on CUDA,
// captured again when the set of running sequences changes.
#include <algorithm>
#include <cmath>

#include "gpukit/errors.h"
#include "gpukit/sampling.h"
#include "llm/decode.h"
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

Generation::~Generation() = default;
Generation::Generation(Generation&&) noexcept = default;

namespace {
// Each sequence's stream of draws is keyed by (seed, its batch index) and the position.
int64_t row_seed(uint64_t seed, size_t b) { return int64_t(seed * 1000003ull + b); }
}  // namespace

std::vector<int32_t> Generation::sample_prefill(const Array& logits, const std::vector<size_t>& rows) {
  const int64_t n = int64_t(rows.size());
  Device d = logits.device();
  auto host = [&](DType t) { return Array::empty({n}, t, Device{}); };
  Array temp = host(DType::f32), topk = host(DType::i32), topp = host(DType::f32), seeds = host(DType::i64),
        pos = host(DType::i64);
  for (int64_t r = 0; r < n; ++r) {
    const size_t b = rows[size_t(r)];
    temp.data_as<float>()[r] = float(o_.temperature);
    topk.data_as<int32_t>()[r] = int32_t(std::min<int64_t>(o_.top_k, m_->config().vocab_size));  // >= V: all tokens
    topp.data_as<float>()[r] = float(o_.top_p);
    seeds.data_as<int64_t>()[r] = row_seed(o_.seed, b);
    pos.data_as<int64_t>()[r] = cache_->length(seqs_[b]);  // the position of the token drawn
  }
  sampling::Params p;
  p.temperature = temp.to(d, nullptr, true);
  p.top_k = topk.to(d, nullptr, true);
  p.top_p = topp.to(d, nullptr, true);
  Array tokens = sampling::decode_step(logits, p, seeds.to(d, nullptr, true), pos.to(d, nullptr, true)).tokens;
  tokens = tokens.to(Device{});
  return std::vector<int32_t>(tokens.data_as<int32_t>(), tokens.data_as<int32_t>() + n);
}

std::vector<int64_t> Generation::graph_nodes() const {
  if (!runner_) return {0, 0, 0, 0};
  const auto& n = runner_->graph_nodes();
  return {n.total, n.kernels, n.memcpy, n.memset};
}

std::vector<int32_t> Generation::step() {
  const size_t B = prompts_.size();
  std::vector<int32_t> result(B, -1);
  if (done()) return result;
  const ModelConfig& c = m_->config();
  std::vector<size_t> rows;
  std::vector<int64_t> seqs;
  for (size_t b = 0; b < B; ++b) {
    if (!reason_[b].empty()) continue;
    if (started_ && cache_->length(seqs_[b]) >= c.max_positions) {
      reason_[b] = "length";
      continue;
    }
    rows.push_back(b);
    seqs.push_back(seqs_[b]);
  }
  if (rows.empty()) return result;
  std::vector<int32_t> chosen;
  if (!started_) {
    std::vector<std::vector<int32_t>> toks;
    for (size_t b : rows) toks.push_back(prompts_[b]);
    Array logits = m_->step(*cache_, seqs, toks, false);  // [n, V] float32
    started_ = true;
    last_logits_ = logits;
    chosen = sample_prefill(logits, rows);
  } else {
    if (!runner_ || !runner_->same_rows(seqs)) {
      runner_.reset();  // its graph and buffers go first
      std::vector<DecodeRow> dr;
      for (size_t b : rows) {
        const int64_t n = cache_->length(seqs_[b]);
        const int64_t left = std::max<int64_t>(o_.max_new_tokens - int64_t(out_[b].size()), 1);
        dr.push_back({seqs_[b], row_seed(o_.seed, b), std::min(n + left, c.max_positions)});
      }
      const bool graph = o_.cuda_graph.value_or(m_->options().cuda_graph) && m_->device().is_cuda();
      runner_ = std::make_unique<DecodeRunner>(*m_, *cache_, dr, o_, graph, o_.lookahead);
      if (graph) ++captures_;
    }
    std::vector<int32_t> toks;
    bool more = true;  // every row can run one more step after this one (unless EOS / stop)
    for (size_t b : rows) {
      toks.push_back(out_[b].back());
      more = more && int64_t(out_[b].size()) + 1 < o_.max_new_tokens &&
             cache_->length(seqs_[b]) + 2 < c.max_positions;
    }
    chosen = runner_->step(toks, more);
    last_logits_ = runner_->logits();
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    const size_t b = rows[r];
    int32_t t = chosen[r];
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

Array Generation::last_logits() const {
  if (!last_logits_.defined()) throw ValueError("last_logits: no step has run yet");
  return last_logits_.to(Device{}).copy();
}

std::vector<std::vector<int32_t>> generate(std::shared_ptr<Model> model,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& o) {
  Generation g(std::move(model), prompts, o);
  while (!g.done()) g.step();
  return g.generated();
}

}  // namespace gk::llm
