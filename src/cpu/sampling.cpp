// CPU reference of the sampling ops. It implements the definitions of
// include/gpukit/sampling.h directly: the thresholds come from a full sort of
// each row (the CUDA kernels use radix selection instead), masses are exact
// integer sums, the draw is a scan in vocabulary order.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "gpukit/errors.h"
#include "ops/backend.h"
#include "ops/philox.h"
#include "ops/sampling_args.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("sampling.argmax", "sampling.topk", "sampling.apply_temperature", "sampling.apply_penalties",
                    "sampling.apply_logit_bias", "sampling.ban_tokens", "sampling.apply_min_tokens",
                    "sampling.top_k_filter", "sampling.top_p_filter", "sampling.min_p_filter",
                    "sampling.typical_p_filter", "sampling.sample", "sampling.decode_step");

namespace {

template <class T>
void load_row(const void* base, int64_t r, int64_t stride, int64_t V, std::vector<float>& x) {
  const T* p = static_cast<const T*>(base) + r * stride;
  for (int64_t i = 0; i < V; ++i) x[i] = float(p[i]);
}

void load(const void* base, DType dt, int64_t r, int64_t stride, int64_t V, std::vector<float>& x) {
  switch (dt) {
    case DType::f32: return load_row<float>(base, r, stride, V, x);
    case DType::bf16: return load_row<bf16>(base, r, stride, V, x);
    case DType::f16: return load_row<f16>(base, r, stride, V, x);
    default: throw TypeError("logits: dtype must be float32, bfloat16 or float16");
  }
}

void check_nan(const std::vector<float>& x, int64_t r) {
  for (float v : x)
    if (v != v) throw ValueError(cat("logits: row ", r, " contains NaN"));
}

// Largest key value tau (over `idx`, ordered by key descending) such that the mass
// of the entries with key >= tau reaches `target`; ties form one group.
template <class Key>
Key threshold(std::vector<int64_t>& idx, const std::vector<Key>& key, const std::vector<uint64_t>& w,
              uint64_t target) {
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return key[a] > key[b]; });
  uint64_t cum = 0;
  size_t i = 0;
  while (i < idx.size()) {
    Key g = key[idx[i]];
    while (i < idx.size() && key[idx[i]] == g) cum += w[idx[i++]];
    if (cum >= target) return g;
  }
  return idx.empty() ? Key{} : key[idx.back()];
}

void run_row(const SampleArgs& a, int64_t r, std::vector<float>& x, std::vector<int32_t>& cnt) {
  const int64_t V = a.V;
  load(a.logits, a.dtype, r, a.row_stride, V, x);
  check_nan(x, r);
  for (auto& v : x) v = smp::sanitize(v);
  smp::RowCfg c = smp::row_cfg(a, r);
  if (a.bias)
    for (int64_t i = 0; i < V; ++i) x[i] += a.bias[r * a.bias_row_stride + i];
  if (a.history) {
    int64_t len = std::clamp<int64_t>(a.hist_len.at(r), 0, a.hist_max);
    const int32_t* h = a.history + r * a.hist_stride;
    for (int64_t j = 0; j < len; ++j)
      if (h[j] >= 0 && h[j] < V) ++cnt[h[j]];
    for (int64_t j = 0; j < len; ++j) {
      int32_t t = h[j];
      if (t < 0 || t >= V || cnt[t] == 0) continue;
      x[t] = smp::penalize(x[t], cnt[t], c.rep, c.presence, c.frequency);
      cnt[t] = 0;
    }
  }
  if (a.banned)
    for (int64_t j = 0; j < a.n_banned; ++j) {
      int32_t t = a.banned[r * a.banned_row_stride + j];
      if (t >= 0 && t < V) x[t] = -INFINITY;
    }
  if (a.eos && a.generated.at(r) < a.min_tokens.at(r))
    for (int64_t j = 0; j < a.n_eos; ++j)
      if (a.eos[j] >= 0 && a.eos[j] < V) x[a.eos[j]] = -INFINITY;

  float* out = a.out ? a.out + r * V : nullptr;
  if (a.mode == SampleMode::Process) {
    for (int64_t i = 0; i < V; ++i) out[i] = a.scale_by_temperature && !c.greedy ? x[i] / c.temp : x[i];
    return;
  }
  std::vector<float>& s = x;
  for (auto& v : s) v = smp::finite_top(c.greedy ? v : v / c.temp);
  int64_t am = 0;
  for (int64_t i = 1; i < V; ++i)
    if (s[i] > s[am]) am = i;
  const float m = s[am];
  auto fail_row = [&] {
    if (out) std::fill(out, out + V, -INFINITY);
    if (a.tokens) a.tokens[r] = -1;
    if (a.logprobs) a.logprobs[r] = NAN;
    for (int j = 0; j < a.top_n; ++j) {
      a.top_ids[r * a.top_n + j] = -1;
      a.top_logprobs[r * a.top_n + j] = NAN;
    }
  };
  if (m == -INFINITY) return fail_row();

  double Z = 0;
  std::vector<uint64_t> w(V);
  std::vector<float> e(V);
  for (int64_t i = 0; i < V; ++i) {
    e[i] = smp::rel_exp(s[i], m);
    Z += e[i];
    w[i] = smp::weight_of(e[i]);
  }
  int64_t token = am;
  if (!c.greedy || a.mode == SampleMode::Filter) {
    std::vector<uint32_t> key(V);
    for (int64_t i = 0; i < V; ++i) key[i] = smp::order_key(s[i]);
    std::vector<char> keep(V, 1);
    std::vector<int64_t> idx(V);
    std::iota(idx.begin(), idx.end(), 0);
    uint32_t kk = 0;
    if (c.top_k) {
      std::vector<uint32_t> ks(key);
      std::nth_element(ks.begin(), ks.begin() + (c.top_k - 1), ks.end(), std::greater<>());
      kk = ks[c.top_k - 1];
      for (int64_t i = 0; i < V; ++i) keep[i] = key[i] >= kk;
    }
    if (c.top_p < 1.f) {
      std::vector<int64_t> in;
      uint64_t Wk = 0;
      for (int64_t i = 0; i < V; ++i)
        if (keep[i]) in.push_back(i), Wk += w[i];
      uint32_t kp = threshold(in, key, w, smp::frac_target(c.top_p, Wk));
      for (int64_t i = 0; i < V; ++i) keep[i] = keep[i] && key[i] >= kp;
    }
    if (c.min_p > 0.f)
      for (int64_t i = 0; i < V; ++i) keep[i] = keep[i] && e[i] >= c.min_p;
    if (c.typical < 1.f) {
      uint64_t W1 = 0;
      int64_t S1 = 0;
      std::vector<int64_t> in;
      for (int64_t i = 0; i < V; ++i)
        if (keep[i]) {
          in.push_back(i);
          W1 += w[i];
          if (w[i]) S1 += smp::weighted_logit(w[i], s[i] - m);
        }
      double mean = double(S1) / double(W1);
      std::vector<uint32_t> tk(V);
      for (int64_t i = 0; i < V; ++i) tk[i] = smp::typical_key(s[i] - m, mean);
      uint32_t kt = threshold(in, tk, w, smp::frac_target(c.typical, W1));
      for (int64_t i = 0; i < V; ++i) keep[i] = keep[i] && tk[i] >= kt;
    }
    if (a.mode == SampleMode::Filter) {
      for (int64_t i = 0; i < V; ++i) out[i] = keep[i] ? s[i] : -INFINITY;
      return;
    }
    uint64_t W = 0;
    for (int64_t i = 0; i < V; ++i)
      if (keep[i]) W += w[i];
    if (W > 0) {
      uint32_t tag = a.row_tag_is_index ? uint32_t(r) : 0u;
      uint64_t bits = philox::draw_bits(uint64_t(a.seed.at(r)), uint64_t(a.position.at(r)), tag);
      uint64_t t = smp::scale_draw(W, bits), acc = 0;
      for (int64_t i = 0; i < V; ++i) {
        if (!keep[i]) continue;
        acc += w[i];
        if (acc > t) {
          token = i;
          break;
        }
      }
    }
  }
  const float logZ = float(std::log(Z));
  a.tokens[r] = int32_t(token);
  if (a.logprobs) a.logprobs[r] = (s[token] - m) - logZ;
  if (a.top_n > 0) {
    std::vector<int64_t> idx(V);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + a.top_n, idx.end(),
                      [&](int64_t p, int64_t q) { return s[p] > s[q] || (s[p] == s[q] && p < q); });
    for (int j = 0; j < a.top_n; ++j) {
      a.top_ids[r * a.top_n + j] = int32_t(idx[j]);
      a.top_logprobs[r * a.top_n + j] = (s[idx[j]] - m) - logZ;
    }
  }
}

}  // namespace

void sample_rows(const SampleArgs& a) {
  std::vector<float> x(a.V);
  std::vector<int32_t> cnt(a.history ? a.V : 0, 0);
  for (int64_t r = 0; r < a.B; ++r) run_row(a, r, x, cnt);
}

void topk_rows(const void* logits, DType dt, int64_t B, int64_t V, int64_t row_stride, int64_t k, float* values,
               int32_t* indices) {
  std::vector<float> x(V);
  std::vector<int64_t> idx(V);
  for (int64_t r = 0; r < B; ++r) {
    load(logits, dt, r, row_stride, V, x);
    check_nan(x, r);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int64_t p, int64_t q) { return x[p] > x[q] || (x[p] == x[q] && p < q); });
    for (int64_t j = 0; j < k; ++j) {
      if (values) values[r * k + j] = x[idx[j]];
      indices[r * k + j] = int32_t(idx[j]);
    }
  }
}

}  // namespace gk::cpu
