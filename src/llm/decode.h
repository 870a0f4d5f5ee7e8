// The decode step of a generation for a fixed set of running sequences: the inputs
// live in fixed buffers on the model's device (token ids, positions, lengths, the
// block table [B, max_blocks], sampling parameters and seeds), rewritten before each
// step with small asynchronous host-to-device copies. On CUDA the whole step
// (embedding, layers, final norm, lm head, gk::sampling::decode_step) is captured
// once as a CUDA graph and replayed per token; the arrays made during the capture
// (activations, logits, tokens) belong to the graph, so each replay reuses them.
// Eager and replayed steps run the same ops on the same buffers: the same bits.
//
// Lookahead (CUDA): the step ends by writing its sampled tokens into the ids buffer and
// advancing positions and lengths on the device, and copies the tokens to pinned host
// memory. So step k+1 can be launched before the host has read step k's tokens: the
// host then waits only for step k's copy (an event) while step k+1 runs, hiding the
// host's per-token work. The speculative step is used when the caller passes exactly
// the tokens it produced for the same sequences (the normal case); otherwise it is
// waited for and the step recomputed from the given tokens. Its extra key/value write
// for a sequence that finished lands in a page reserved for it past its length.
#pragma once
#include <vector>

#include "gpukit/allocator.h"
#include "gpukit/llm.h"
#include "gpukit/sampling.h"
#include "gpukit/stream.h"

namespace gk::llm {

struct DecodeRow {
  int64_t seq;       // the KV cache sequence
  int64_t seed;      // the row's sampling identity
  int64_t max_len;   // the longest the sequence may grow during this generation
};

class DecodeRunner {
 public:
  DecodeRunner(Model& model, KvCache& cache, const std::vector<DecodeRow>& rows, const GenerateOptions& o,
               bool use_graph, bool lookahead);
  ~DecodeRunner();
  DecodeRunner(const DecodeRunner&) = delete;
  DecodeRunner& operator=(const DecodeRunner&) = delete;
  // One step: appends tokens[r] to row r's sequence and returns the sampled token of
  // each row (copied to the host: the only synchronization of the step).
  // may_continue: every row can take one more step after this one (lookahead allowed).
  std::vector<int32_t> step(const std::vector<int32_t>& tokens, bool may_continue = false);
  // The running sequences, in row order.
  bool same_rows(const std::vector<int64_t>& seqs) const;
  bool captured() const { return graph_.captured(); }
  // Nodes of the captured step (zeros when eager): all, kernels, copies, memsets.
  struct Nodes {
    int64_t total = 0, kernels = 0, memcpy = 0, memset = 0;
  };
  const Nodes& graph_nodes() const { return nodes_; }
  // float32 [B, V] logits of the last step returned (device). With lookahead in graph
  // mode the buffer already holds the next step's logits: use lookahead = false to read them.
  const Array& logits() const { return step_logits_; }

 private:
  void body();
  void launch();                     // body() or a graph replay, then the token read-back
  void prepare(int64_t extra);       // reserves pages for length + extra, uploads new table entries
  void wait_all();
  void count_nodes();
  Nodes nodes_;
  Model& m_;
  KvCache& cache_;
  std::vector<DecodeRow> rows_;
  bool use_graph_, greedy_ = false;
  int64_t B_ = 0, max_blocks_ = 0;
  Device d_;
  Stream stream_;
  Graph graph_;
  // host mirrors and their device buffers
  Array h_in_, d_in_;  // int32 [3, B]: ids, positions, lengths
  Array h_bt_, d_bt_;  // int32 [B, max_blocks]
  std::vector<size_t> pages_seen_;
  bool bt_dirty_ = true;
  DecodeBatch batch_;
  sampling::Params params_;
  Array seeds_;
  Array h_tok_;
  // outputs of the step (graph-owned when captured)
  Array logits_, tokens_, step_logits_, logits_of_[2];
  Array argmax_keys_;  // int64 [B] zeros: greedy token folded into the lm head (Model::head_argmax)
  // lookahead: two pinned read-back buffers and their events, used alternately
  bool lookahead_ = false;
  PinnedBuffer pin_[2];
  Event ev_[2];
  int parity_ = 0;       // the buffer of the next launch
  bool inflight_ = false;  // a launched step whose tokens were not returned yet
  int inflight_parity_ = 0;
  std::vector<int32_t> expect_;  // the ids the in-flight step runs on
};

}  // namespace gk::llm
