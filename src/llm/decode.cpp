// DecodeRunner: the decode step over fixed buffers, captured as a CUDA graph on CUDA
// (see decode.h).
#include "llm/decode.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "gpukit/errors.h"
#include "gpukit/gemm.h"
#include "gpukit/ops.h"
#include "llm/fused.h"
#if GPUKIT_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_util.h"
#include "ops/backend.h"
#endif

namespace gk::llm {

namespace {
template <class T>
Array host_vec(int64_t n, T value, DType t) {
  Array a = Array::empty({n}, t, Device{});
  std::fill(a.data_as<T>(), a.data_as<T>() + n, value);
  return a;
}
}  // namespace

DecodeRunner::DecodeRunner(Model& model, KvCache& cache, const std::vector<DecodeRow>& rows,
                           const GenerateOptions& o, bool use_graph, bool lookahead)
    : m_(model), cache_(cache), rows_(rows), d_(model.device()) {
  B_ = int64_t(rows.size());
  if (B_ == 0) throw ValueError("DecodeRunner: no sequences");
  use_graph_ = use_graph && d_.is_cuda();
  greedy_ = !(o.temperature > 0);
  lookahead_ = lookahead && d_.is_cuda();
  const int64_t bs = cache.block_size();
  for (auto& r : rows) {
    // + 1: the page a lookahead step may write past the last token
    max_blocks_ = std::max(max_blocks_, (r.max_len + 1 + bs - 1) / bs);
    max_blocks_ = std::max(max_blocks_, int64_t(cache.pages(r.seq).size()));
  }
  max_blocks_ = std::max<int64_t>(1, std::min(max_blocks_, std::max<int64_t>(cache.num_blocks(), 1)));
  if (d_.is_cuda()) stream_ = Stream::current(d_);
  const Stream* sp = d_.is_cuda() ? &stream_ : nullptr;
  h_in_ = Array::empty({3, B_}, DType::i32, Device{});
  std::memset(h_in_.data(), 0, h_in_.nbytes());
  h_bt_ = Array::empty({B_, max_blocks_}, DType::i32, Device{});
  std::memset(h_bt_.data(), 0, h_bt_.nbytes());
  if (d_.is_cuda()) {
    d_in_ = Array::empty({3, B_}, DType::i32, d_, sp);
    d_bt_ = Array::empty({B_, max_blocks_}, DType::i32, d_, sp);
  } else {  // eager on the CPU: the host arrays are the buffers
    d_in_ = h_in_;
    d_bt_ = h_bt_;
  }
  pages_seen_.assign(size_t(B_), 0);
  batch_.ids = d_in_.select(0, 0);
  batch_.positions = d_in_.select(0, 1);
  batch_.lengths = d_in_.select(0, 2);
  batch_.block_table = d_bt_;
  // Per-row sampling parameters and seeds: constant for the runner's life.
  params_.temperature = host_vec<float>(B_, float(o.temperature), DType::f32).to(d_, sp, true);
  const int64_t top_k = std::min<int64_t>(o.top_k, model.config().vocab_size);  // >= V: all tokens
  // A filter that is off is left out: each per-row filter array costs decode_step its own
  // threshold-search launches even for rows where it does nothing.
  if (top_k > 0 && top_k < model.config().vocab_size)
    params_.top_k = host_vec<int32_t>(B_, int32_t(top_k), DType::i32).to(d_, sp, true);
  if (o.top_p < 1.0) params_.top_p = host_vec<float>(B_, float(o.top_p), DType::f32).to(d_, sp, true);
  Array seeds = Array::empty({B_}, DType::i64, Device{});
  for (int64_t r = 0; r < B_; ++r) seeds.data_as<int64_t>()[r] = rows[size_t(r)].seed;
  seeds_ = seeds.to(d_, sp, true);
  h_tok_ = Array::empty({B_}, DType::i32, Device{});
  if (greedy_ && d_.is_cuda() && model.head_argmax(B_))
    argmax_keys_ = full({B_}, Scalar::of_int(0), DType::i64, d_, sp);
  if (d_.is_cuda()) {
    for (int i = 0; i < 2; ++i) {
      pin_[i] = pinned_acquire(size_t(B_) * sizeof(int32_t));
      ev_[i] = Event::create(d_, /*timing=*/false);
    }
  }
}

DecodeRunner::~DecodeRunner() {
  try {
    wait_all();
    for (auto& p : pin_)
      if (p.ptr) pinned_release(p, stream_);
  } catch (...) {  // a failed device: nothing to wait for
  }
}

void DecodeRunner::wait_all() {
  if (d_.is_cuda() && stream_.valid()) stream_.synchronize();
  inflight_ = false;
}

bool DecodeRunner::same_rows(const std::vector<int64_t>& seqs) const {
  if (seqs.size() != rows_.size()) return false;
  for (size_t r = 0; r < seqs.size(); ++r)
    if (seqs[r] != rows_[r].seq) return false;
  return true;
}

// The step: forward, sampling, then the inputs of the next step written on the device
// (ids = the sampled tokens, positions and lengths + 1).
void DecodeRunner::body() {
  if (argmax_keys_.defined()) {  // greedy, token folded into the lm head: one launch reads it and advances
    logits_ = m_.decode_batch(cache_, batch_, argmax_keys_);
    tokens_ = fused::advance_argmax(d_in_, argmax_keys_);
    return;
  }
  logits_ = m_.decode_batch(cache_, batch_);  // float32 [B, V]
  // Greedy rows: the argmax kernel (the same token as decode_step's greedy rule, ties to
  // the lowest id, at a fraction of the fused step's cost).
  tokens_ = greedy_ ? sampling::argmax(logits_) : sampling::decode_step(logits_, params_, seeds_, batch_.lengths).tokens;
  if (m_.options().fusion >= 2 && d_.is_cuda()) {
    fused::advance_inputs(d_in_, tokens_);  // one launch
  } else {
    copy_into(batch_.ids, tokens_);
    Array pl = d_in_.narrow(0, 1, 2);
    copy_into(pl, binary(BinaryOp::Add, pl, Scalar::of_int(1)));
  }
}

// The nodes of the graph being captured on stream_, by type (diagnostics: how many
// launches one step costs).
void DecodeRunner::count_nodes() {
  nodes_ = {};
#if GPUKIT_WITH_CUDA
  auto st = static_cast<cudaStream_t>(stream_.handle());
  cudaStreamCaptureStatus status;
  unsigned long long id = 0;
  cudaGraph_t g = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  size_t nd = 0;
#if CUDART_VERSION >= 13000
  const cudaGraphEdgeData* ed = nullptr;
  GK_CUDA_CHECK(cudaStreamGetCaptureInfo(st, &status, &id, &g, &deps, &ed, &nd));
#else
  GK_CUDA_CHECK(cudaStreamGetCaptureInfo(st, &status, &id, &g, &deps, &nd));
#endif
  if (status != cudaStreamCaptureStatusActive || !g) return;
  size_t n = 0;
  GK_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) GK_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  nodes_.total = int64_t(n);
  for (size_t i = 0; i < n; ++i) {
    cudaGraphNodeType t;
    GK_CUDA_CHECK(cudaGraphNodeGetType(nodes[i], &t));
    if (t == cudaGraphNodeTypeKernel) ++nodes_.kernels;
    else if (t == cudaGraphNodeTypeMemcpy) ++nodes_.memcpy;
    else if (t == cudaGraphNodeTypeMemset) ++nodes_.memset;
  }
#endif
}

void DecodeRunner::prepare(int64_t extra) {
  int32_t* bt = h_bt_.data_as<int32_t>();
  bool dirty = false;
  for (int64_t r = 0; r < B_; ++r) {
    const int64_t seq = rows_[size_t(r)].seq;
    cache_.reserve(seq, cache_.length(seq) + extra);
    const auto& pg = cache_.pages(seq);
    if (int64_t(pg.size()) > max_blocks_)
      throw ValueError(cat("decode: sequence ", seq, " needs ", pg.size(), " pages, more than the ", max_blocks_,
                           " its block table was made for"));
    for (size_t j = pages_seen_[size_t(r)]; j < pg.size(); ++j) {
      bt[r * max_blocks_ + int64_t(j)] = pg[j];
      dirty = true;
    }
    pages_seen_[size_t(r)] = pg.size();
  }
  if (dirty && d_.is_cuda()) copy_into(d_bt_, h_bt_, &stream_);  // stream ordered before the next launch
}

void DecodeRunner::launch() {
  if (use_graph_) {
    if (!graph_.captured()) {
      graph_ = Graph::create(stream_);
      graph_.begin();
      try {
        body();
      } catch (...) {
        try {
          graph_.end();
        } catch (...) {
        }
        graph_ = Graph();
        logits_ = tokens_ = Array();
        throw;
      }
      count_nodes();
      graph_.end();
    }
    graph_.replay(&stream_);
  } else {
    body();
  }
  logits_of_[parity_] = logits_;
#if GPUKIT_WITH_CUDA
  if (d_.is_cuda()) {  // the tokens to pinned memory, in stream order before any later step
    cuda::memcpy_async(pin_[parity_].ptr, tokens_.data(), size_t(B_) * sizeof(int32_t), 2, stream_.handle());
    ev_[parity_].record(stream_);
  }
#endif
  inflight_ = true;
  inflight_parity_ = parity_;
  parity_ ^= 1;
}

std::vector<int32_t> DecodeRunner::step(const std::vector<int32_t>& tokens, bool may_continue) {
  if (int64_t(tokens.size()) != B_)
    throw ValueError(cat("tokens: ", tokens.size(), " tokens for a decode batch of ", B_));
  if (inflight_ && tokens != expect_) wait_all();  // the speculative step ran on other tokens: redo
  Array logits_k;
  if (!inflight_) {
    prepare(1);
    int32_t* in = h_in_.data_as<int32_t>();
    for (int64_t r = 0; r < B_; ++r) {
      const int64_t n = cache_.length(rows_[size_t(r)].seq);
      in[r] = tokens[size_t(r)];
      in[B_ + r] = int32_t(n);
      in[2 * B_ + r] = int32_t(n + 1);
    }
    if (d_.is_cuda()) copy_into(d_in_, h_in_, &stream_);  // pinned staging, asynchronous
    launch();
  }
  const int k = inflight_parity_;
  logits_k = logits_of_[k];
  std::vector<int32_t> out(static_cast<size_t>(B_));
  if (d_.is_cuda()) {
    if (lookahead_ && may_continue) {
      prepare(2);  // the page the next step writes, before it is launched
      launch();    // step k + 1 runs on the device while the host reads step k
    } else {
      inflight_ = false;
    }
    ev_[k].synchronize();
    std::memcpy(out.data(), pin_[k].ptr, out.size() * sizeof(int32_t));
  } else {
    copy_into(h_tok_, tokens_);
    std::copy(h_tok_.data_as<int32_t>(), h_tok_.data_as<int32_t>() + B_, out.begin());
    inflight_ = false;
  }
  for (auto& r : rows_) cache_.advance(r.seq, 1);
  step_logits_ = logits_k;
  expect_ = out;
  return out;
}

}  // namespace gk::llm

// ---- profile ----
namespace gk::llm {

std::vector<OpTime> profile_decode(Model& m, int64_t batch, int64_t context, int64_t reps) {
  const ModelConfig& c = m.config();
  if (batch < 1 || context < 1 || context + reps + 1 > c.max_positions || reps < 1)
    throw ValueError(cat("profile_decode: batch and context must be >= 1 and context + reps within the context, got ",
                         batch, ", ", context, ", ", reps));
  const Device d = m.device();
  KvCache cache = m.make_cache(std::vector<int64_t>(size_t(batch), context + reps + 1));
  std::vector<int64_t> seqs;
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t b = 0; b < batch; ++b) {
    seqs.push_back(cache.add_sequence());
    std::vector<int32_t> p;
    for (int64_t i = 0; i < context; ++i) p.push_back(int32_t((i * 7919 + b * 104729 + 13) % c.vocab_size));
    prompts.push_back(p);
  }
  m.step(cache, seqs, prompts, false);  // the cached context
  std::vector<std::vector<double>> runs;
  std::vector<std::pair<std::string, int>> names;
  Stream s = d.is_cuda() ? Stream::current(d) : Stream();
  Array filler_a, filler_b;
  if (d.is_cuda()) {
    filler_a = full({4096, 4096}, Scalar::of(0.01), DType::bf16, d);
    filler_b = full({4096, 4096}, Scalar::of(0.01), DType::bf16, d);
  }
  for (int64_t rep = 0; rep <= reps; ++rep) {  // rep 0: warm-up
    std::vector<Event> events;
    std::vector<double> wall;
    std::vector<std::pair<std::string, int>> nm;
    auto t0 = std::chrono::steady_clock::now();
    auto record = [&](const char* what, int layer) {
      if (d.is_cuda()) {
        Event e = Event::create(d);
        e.record(s);
        events.push_back(e);
      } else {
        wall.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      nm.emplace_back(what, layer);
    };
    if (d.is_cuda()) {
      s.synchronize();
      // Busy the GPU (~0.1 ms per product) while the host enqueues the step.
      for (int i = 0; i < 64; ++i) (void)matmul(filler_a, filler_b);
    }
    // Empty intervals first: what an event record costs between two ops, "(event)".
    for (int i = 0; i < 6; ++i) record("(event)", -1);
    m.op_hook = record;
    std::vector<int32_t> ids(size_t(batch), 1);
    try {
      m.step(cache, seqs, [&] {
        std::vector<std::vector<int32_t>> t;
        for (int32_t x : ids) t.push_back({x});
        return t;
      }(), false);
    } catch (...) {
      m.op_hook = nullptr;
      throw;
    }
    m.op_hook = nullptr;
    if (d.is_cuda()) s.synchronize();
    std::vector<double> times;
    for (size_t i = 1; i < nm.size(); ++i)
      times.push_back(d.is_cuda() ? double(events[i - 1].elapsed_ms(events[i])) : wall[i] - wall[i - 1]);
    names.assign(nm.begin() + 1, nm.end());
    if (rep > 0) runs.push_back(times);
  }
  std::vector<OpTime> out;
  for (size_t i = 0; i < names.size(); ++i) {
    std::vector<double> v;
    for (auto& r : runs) v.push_back(r[i]);
    std::sort(v.begin(), v.end());
    out.push_back({names[i].first, names[i].second, v[v.size() / 2]});
  }
  return out;
}

}  // namespace gk::llm
