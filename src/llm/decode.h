// The decode step of a generation for a fixed set of running sequences: the inputs
// live in fixed buffers on the model's device (token ids, positions, lengths, the
// block table [B, max_blocks], sampling parameters and seeds), rewritten before each
// step with small asynchronous host-to-device copies. On CUDA the whole step
// (embedding, layers, final norm, lm head, gk::sampling::decode_step) is captured
// once as a CUDA graph and replayed per token; the arrays made during the capture
// (activations, logits, tokens) belong to the graph, so each replay reuses them.
// Eager and replayed steps run the same ops on the same buffers: the same bits.
#pragma once
#include <vector>

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
               bool use_graph);
  // One step: appends tokens[r] to row r's sequence and returns the sampled token of
  // each row (copied to the host: the only synchronization of the step).
  std::vector<int32_t> step(const std::vector<int32_t>& tokens);
  // The running sequences, in row order.
  bool same_rows(const std::vector<int64_t>& seqs) const;
  bool captured() const { return graph_.captured(); }
  const Array& logits() const { return logits_; }  // float32 [B, V] of the last step (device)

 private:
  void body();
  Model& m_;
  KvCache& cache_;
  std::vector<DecodeRow> rows_;
  bool use_graph_;
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
  Array logits_, tokens_;
};

}  // namespace gk::llm
