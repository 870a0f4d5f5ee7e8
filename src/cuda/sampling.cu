// CUDA sampling: the fused decode step and the processors / filters / sample ops that
// share it. Every row of the vocabulary is split into chunks of 2048 entries with one
// 256-thread CTA per chunk (grid = chunks x rows), in a few back-to-back passes:
//  1. k_process: logits (f32/bf16/f16, strided rows) -> processed f32 row s in the work
//     buffer: NaN -> -inf, +inf -> FLT_MAX, bias, penalties (exact integer history counts
//     of the chunk in shared memory), bans, EOS, temperature; per-chunk max/argmax,
//     merged by the last CTA of the row (integer done-counter).
//  2. k_select (x3 levels per filter): radix select (11 + 11 + 10 bits) of a threshold on
//     the float order key, top-k by count, top-p / typical-p by integer mass: per-CTA
//     shared histograms flushed into the row's global histogram with integer atomics;
//     the row's last CTA picks the bin (fixed order) and re-zeroes the histogram.
//  3. k_final: the kept mass, the sum of exp and the top-n candidates of each chunk;
//     the row's last CTA merges them in chunk order, draws with Philox keyed by
//     (seed, position, row tag), finds the chunk then the token by ordered scans.
// No float atomics, fixed chunking (independent of the batch): the same bits every run,
// in or out of a batch, eager or replayed from a graph. No host synchronization.
#include <cfloat>
#include <cstdlib>

#include "core/cuda_util.h"
#include "cuda/common/sampling_weight.cuh"
#include "cuda/common/sampling_wide.cuh"
#include "cuda/common/sampling_wide_select.cuh"
#include "ops/backend.h"
#include "ops/philox.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("sampling.argmax", "sampling.topk", "sampling.apply_temperature", "sampling.apply_penalties",
                     "sampling.apply_logit_bias", "sampling.ban_tokens", "sampling.apply_min_tokens",
                     "sampling.top_k_filter", "sampling.top_p_filter", "sampling.min_p_filter",
                     "sampling.typical_p_filter", "sampling.sample", "sampling.decode_step");

namespace {

using namespace wide;
constexpr int kCountMask = 0x3fffffff, kBanBit = 0x40000000;

// ---------------------------------------------------------------- pass 1
// topk_hist: also the level-0 count histogram of the top-k select (saves a launch).
template <class T>
__global__ void __launch_bounds__(kThreads) k_process(SampleArgs a, Ws w, bool topk_hist) {
  pdl_enter();
  __shared__ int mark[kChunk];
  __shared__ unsigned long long hv[kBins];
  __shared__ unsigned int hc[kBins];
  __shared__ Scratch sh;
  const int64_t r = blockIdx.y, V = a.V;
  const int64_t c0 = int64_t(blockIdx.x) * kChunk, c1 = min(V, c0 + kChunk);
  const smp::RowCfg c = smp::row_cfg(a, r);
  const bool marks = a.history || a.banned || (a.eos && a.generated.at(r) < a.min_tokens.at(r));
  if (marks) {
    for (int j = threadIdx.x; j < kChunk; j += kThreads) mark[j] = 0;
    __syncthreads();
    if (a.history) {
      int64_t len = a.hist_len.at(r);
      len = len < 0 ? 0 : (len > a.hist_max ? a.hist_max : len);
      const int32_t* h = a.history + r * a.hist_stride;
      for (int64_t j0 = 0; j0 < len; j0 += 4 * kThreads) {  // 4 loads in flight per thread
        int32_t t[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int64_t j = j0 + u * kThreads + threadIdx.x;
          t[u] = j < len ? h[j] : -1;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (t[u] >= c0 && t[u] < c1) atomicAdd(&mark[t[u] - c0], 1);
      }
    }
    if (a.banned)
      for (int64_t j = threadIdx.x; j < a.n_banned; j += kThreads) {
        const int32_t t = a.banned[r * a.banned_row_stride + j];
        if (t >= c0 && t < c1) atomicOr(&mark[t - c0], kBanBit);
      }
    if (a.eos && a.generated.at(r) < a.min_tokens.at(r))
      for (int64_t j = threadIdx.x; j < a.n_eos; j += kThreads) {
        const int32_t t = a.eos[j];
        if (t >= c0 && t < c1) atomicOr(&mark[t - c0], kBanBit);
      }
    __syncthreads();
  }
  const T* in = static_cast<const T*>(a.logits) + r * a.row_stride;
  const float* bias = a.bias ? a.bias + r * a.bias_row_stride : nullptr;
  const bool process_only = a.mode == SampleMode::Process;
  const bool scale_out = a.scale_by_temperature && !c.greedy;
  float* work = a.work + r * a.work_stride;
  const bool hist = topk_hist && !process_only && sel_active(a, c, kTopK);
  if (hist) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) hc[b] = 0;
    __syncthreads();
  }
  int cur = -1;
  unsigned int cc = 0;
  float bv = -INFINITY;
  int bi = INT32_MAX;
  float xin[kPer], bin[kPer];  // every load issued before any use
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = c0 + threadIdx.x + j * kThreads;
    xin[j] = i < c1 ? float(in[i]) : 0.f;
    bin[j] = bias && i < c1 ? bias[i] : 0.f;
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = c0 + threadIdx.x + j * kThreads;
    if (i >= c1) break;
    float x = smp::sanitize(xin[j]);
    if (bias) x = smp::fadd_rn(x, bin[j]);
    if (marks) {
      const int mk = mark[i - c0];
      if (mk & kCountMask) x = smp::penalize(x, mk & kCountMask, c.rep, c.presence, c.frequency);
      if (mk & kBanBit) x = -INFINITY;
    }
    if (process_only) {
      a.out[r * V + i] = scale_out ? x / c.temp : x;
      continue;
    }
    const float s = smp::finite_top(c.greedy ? x : x / c.temp);
    work[i] = s;
    if (better(s, int(i), bv, bi)) bv = s, bi = int(i);
    if (hist) {
      const int d = int(smp::order_key(s) >> 21);
      if (d != cur) {
        if (cur >= 0) atomicAdd(&hc[cur], cc);
        cur = d, cc = 0;
      }
      ++cc;
    }
  }
  if (process_only) return;
  if (hist) {
    if (cur >= 0) atomicAdd(&hc[cur], cc);
    __syncthreads();
    unsigned long long* gv = w.hval + r * kBins;
    for (int b = threadIdx.x; b < kBins; b += kThreads)
      if (hc[b]) atomicAdd(&gv[b], (unsigned long long)hc[b]);
  }
  block_argmax(sh, bv, bi);
  Partial* part = w.part + r * w.C;
  if (threadIdx.x == 0) part[blockIdx.x].vmax = bv, part[blockIdx.x].imax = bi;
  if (!last_cta(sh, &w.state[r].counter, unsigned(w.C))) return;
  bv = -INFINITY, bi = INT32_MAX;
  for (int64_t k = threadIdx.x; k < w.C; k += kThreads) {
    const float v = __ldcg(&part[k].vmax);
    const int vi = __ldcg(&part[k].imax);
    if (better(v, vi, bv, bi)) bv = v, bi = vi;
  }
  block_argmax(sh, bv, bi);
  if (threadIdx.x == 0) w.state[r].m = bv, w.state[r].argmax = bi;
  if (hist) finish_level<kTopK>(sh, hv, w.hval + r * kBins, c, w.state[r], 0, 0u);
}

template <int which>
__global__ void __launch_bounds__(kThreads) k_select(SampleArgs a, Ws w, int level) {
  pdl_enter();
  __shared__ unsigned long long hv[kBins];
  __shared__ Scratch sh;
  const int64_t r = blockIdx.y, V = a.V;
  const smp::RowCfg c = smp::row_cfg(a, r);
  if (!sel_active(a, c, which)) return;
  RowState& st = w.state[r];
  const float m = st.m;
  if (m == -INFINITY || (level > 0 && st.dead)) return;
  SelCtx x;
  x.m = m;
  x.kv = which == kTopP ? st.kk : (st.kk > st.kp ? st.kk : st.kp);
  x.minp = c.min_p;
  x.mean = which == kTyp ? typical_mean(st) : 0.0;
  const int shift = level == 0 ? 21 : (level == 1 ? 10 : 0);
  const int width = level == 2 ? 10 : 11;
  const uint32_t mask = (1u << width) - 1u;
  const uint32_t prefix = level > 0 ? st.prefix : 0u;
  for (int b = threadIdx.x; b < kBins; b += kThreads) hv[b] = 0;
  __syncthreads();
  const int64_t c0 = int64_t(blockIdx.x) * kChunk, c1 = min(V, c0 + kChunk);
  const float* row = a.work + r * a.work_stride;
  float sv[kPer];
  load_chunk(row, c0, c1, sv);
  int cur = -1;  // run cache: a thread's entries of a flat row share one bin
  unsigned long long cv = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (ent(c0, j) >= c1) continue;
    const float s = sv[j];
    uint32_t key;
    if (!sel_key<which>(x, s, key)) continue;
    if (level > 0 && (key >> (shift + width)) != prefix) continue;
    // mass selects skip zero-weight entries: a group of weight 0 is never the first to reach
    // the target (target 0 picks the top group, which holds the max; for typical-p the
    // closest group to the weighted mean is weighted) -- fewer bins, fewer atomics
    const unsigned long long v = which == kTopK ? 1ull : weight(s, m);
    if (v == 0) continue;
    const int d = int((key >> shift) & mask);
    if (d != cur) {
      if (cur >= 0) atomicAdd(&hv[cur], cv);
      cur = d, cv = 0;
    }
    cv += v;
  }
  if (cur >= 0) atomicAdd(&hv[cur], cv);
  __syncthreads();
  unsigned long long* gv = w.hval + r * kBins;
  for (int b = threadIdx.x; b < kBins; b += kThreads)
    if (hv[b]) atomicAdd(&gv[b], hv[b]);
  if (!last_cta(sh, &st.counter, unsigned(w.C))) return;
  finish_level<which>(sh, hv, gv, c, st, level, prefix);
}

// typical-p: kept mass W1 and sum of w (s - m) over the entries kept so far (integer atomics)
__global__ void __launch_bounds__(kThreads) k_typstats(SampleArgs a, Ws w) {
  pdl_enter();
  __shared__ Scratch sh;
  const int64_t r = blockIdx.y, V = a.V;
  const smp::RowCfg c = smp::row_cfg(a, r);
  if (!sel_active(a, c, kTyp)) return;
  RowState& st = w.state[r];
  const float m = st.m;
  if (m == -INFINITY) return;
  SelCtx x{m, st.kk > st.kp ? st.kk : st.kp, c.min_p, 0.0};
  const int64_t c0 = int64_t(blockIdx.x) * kChunk, c1 = min(V, c0 + kChunk);
  const float* row = a.work + r * a.work_stride;
  unsigned long long wl = 0;
  long long sl = 0;
  float sv[kPer];
  load_chunk(row, c0, c1, sv);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (ent(c0, j) >= c1) continue;
    const float s = sv[j];
    uint32_t key;
    if (!sel_key<kTyp>(x, s, key)) continue;
    const uint64_t wt = weight(s, m);
    wl += wt;
    if (wt) sl += smp::weighted_logit(wt, smp::fsub_rn(s, m));
  }
  wl = block_sum_u(sh, wl);
  const unsigned long long su = block_sum_u(sh, (unsigned long long)sl);
  if (threadIdx.x == 0) {
    atomicAdd(&st.W1, wl);
    atomicAdd(reinterpret_cast<unsigned long long*>(&st.S1), su);  // two's complement: exact
  }
}

// ---------------------------------------------------------------- final pass
struct Kept {
  float m, minp;
  uint32_t kv, kt;
  bool typ;
  double mean;
  __device__ __forceinline__ bool operator()(float s) const {
    if (smp::order_key(s) < kv) return false;
    if (minp != 0.f && !(smp::rel_exp(s, m) >= minp)) return false;
    if (typ && smp::typical_key(smp::fsub_rn(s, m), mean) < kt) return false;
    return true;
  }
};

constexpr int kStage = 2048;

__global__ void __launch_bounds__(kThreads) k_final(SampleArgs a, Ws w) {
  pdl_enter();
  __shared__ Scratch sh;
  __shared__ float stage_v[kStage];
  __shared__ int stage_i[kStage];
  __shared__ unsigned long long s_rem;
  __shared__ int s_chunk, s_token;
  const int64_t r = blockIdx.y, V = a.V;
  const smp::RowCfg c = smp::row_cfg(a, r);
  const RowState& st = w.state[r];
  const float m = st.m;
  const int64_t c0 = int64_t(blockIdx.x) * kChunk, c1 = min(V, c0 + kChunk);
  const float* row = a.work + r * a.work_stride;
  const bool filt = a.mode == SampleMode::Filter || !c.greedy;
  Kept kept{m, filt ? c.min_p : 0.f, 0u, 0u, false, 0.0};
  if (filt) {
    kept.kv = st.kk > st.kp ? st.kk : st.kp;
    kept.typ = sel_active(a, c, kTyp);
    kept.kt = st.kt;
    kept.mean = kept.typ ? typical_mean(st) : 0.0;
  }
  float sv[kPer];
  load_chunk(row, c0, c1, sv);
  if (m == -INFINITY) {  // no finite logit in the row
    if (a.mode == SampleMode::Filter) {
      for (int j = 0; j < kPer; ++j) {
        const int64_t i = ent(c0, j);
        if (i < c1) a.out[r * V + i] = -INFINITY;
      }
    } else if (blockIdx.x == 0 && threadIdx.x == 0) {
      a.tokens[r] = -1;
      if (a.logprobs) a.logprobs[r] = NAN;
      for (int j = 0; j < a.top_n; ++j) a.top_ids[r * a.top_n + j] = -1, a.top_logprobs[r * a.top_n + j] = NAN;
    }
    return;
  }
  if (a.mode == SampleMode::Filter) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t i = ent(c0, j);
      if (i < c1) a.out[r * V + i] = kept(sv[j]) ? sv[j] : -INFINITY;
    }
    return;
  }
  const bool want_z = a.logprobs || a.top_n > 0;
  unsigned long long mass = 0, z = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (ent(c0, j) >= c1) continue;
    const float e = smp::rel_exp(sv[j], m);
    if (!c.greedy && kept(sv[j])) mass += smp::weight_of(e);
    if (want_z) z += smp::weight_of(e);
  }
  mass = block_sum_u(sh, mass);
  if (want_z) z = block_sum_u(sh, z);
  Partial* part = w.part + r * w.C;
  if (threadIdx.x == 0) part[blockIdx.x].mass = mass, part[blockIdx.x].z = z;
  // this chunk's top-n: n rounds of "the best after (pv, pi)"
  const int n = a.top_n;
  float* tv = w.topv + (r * w.C + blockIdx.x) * n;
  int* ti = w.topi + (r * w.C + blockIdx.x) * n;
  {
    float pv = INFINITY;
    int pi = -1;
    for (int k = 0; k < n; ++k) {
      float v = -INFINITY;
      int vi = INT32_MAX;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int i = int(ent(c0, j));
        if (i >= c1) continue;
        const float s = sv[j];
        const bool after = s < pv || (s == pv && i > pi);
        if (after && better(s, i, v, vi)) v = s, vi = i;
      }
      block_argmax(sh, v, vi);
      if (threadIdx.x == 0) tv[k] = v, ti[k] = vi;
      pv = v, pi = vi;
    }
  }
  if (!last_cta(sh, &w.state[r].counter, unsigned(w.C))) return;

  // ---- the row's last CTA: merge the chunks in a fixed order
  // each thread's partials in one pass (one load each when C <= 256, the usual case)
  unsigned long long zl = 0, Wl = 0, mine = 0;
  for (int64_t k = threadIdx.x; k < w.C; k += kThreads) {
    const unsigned long long mk = __ldcg(&part[k].mass);
    const unsigned long long zk = __ldcg(&part[k].z);
    if (k == threadIdx.x) mine = mk;
    zl += zk;
    Wl += mk;
  }
  float logZ = 0.f;
  // exact integer normalizer Z = sum floor(exp(s - m) 2^40): logZ = log Z - 40 ln 2, the same
  // bits whatever the partition (the fused path computes it the same way)
  if (want_z) logZ = float(log(double(block_sum_u(sh, zl))) - 27.725887222397812377);
  int token = st.argmax;
  if (!c.greedy) {
    const unsigned long long W = block_sum_u(sh, Wl);
    if (W > 0) {
      const uint32_t tag = a.row_tag_is_index ? uint32_t(r) : 0u;
      const uint64_t bits = philox::draw_bits(uint64_t(a.seed.at(r)), uint64_t(a.position.at(r)), tag);
      const unsigned long long t = smp::scale_draw(W, bits);
      if (threadIdx.x == 0) s_chunk = -1, s_token = -1;
      __syncthreads();
      // (1) the chunk holding t: ordered scan of the chunk masses
      unsigned long long acc = 0;
      for (int64_t base = 0; base < w.C; base += kThreads) {
        const int64_t k = base + threadIdx.x;
        const unsigned long long mk = base == 0 ? mine : (k < w.C ? __ldcg(&part[k].mass) : 0ull);
        unsigned long long tot;
        const unsigned long long ex = acc + block_excl_scan(sh, mk, &tot);
        if (mk > 0 && t >= ex && t < ex + mk) s_chunk = int(k), s_rem = t - ex;
        __syncthreads();
        if (s_chunk >= 0) break;
        acc += tot;
      }
      const int ck = s_chunk;
      if (ck >= 0) {
        // (2) the token: ordered scan of that chunk, 8 consecutive entries per thread
        const unsigned long long rem = s_rem;
        const int64_t q0 = int64_t(ck) * kChunk + int64_t(threadIdx.x) * kPer;
        const int64_t q1 = min(V, int64_t(ck) * kChunk + kChunk);
        float qs[kPer];
        if (q0 + kPer <= q1) {  // 32-byte aligned: the row stride is padded, q0 a multiple of 8
          const float4 u = __ldcg(reinterpret_cast<const float4*>(row + q0));
          const float4 v = __ldcg(reinterpret_cast<const float4*>(row + q0 + 4));
          qs[0] = u.x, qs[1] = u.y, qs[2] = u.z, qs[3] = u.w, qs[4] = v.x, qs[5] = v.y, qs[6] = v.z, qs[7] = v.w;
        } else {
#pragma unroll
          for (int j = 0; j < kPer; ++j) qs[j] = q0 + j < q1 ? __ldcg(row + q0 + j) : -INFINITY;
        }
        unsigned long long wj[kPer], loc = 0;
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
          wj[j] = q0 + j < q1 && kept(qs[j]) ? weight(qs[j], m) : 0ull;
          loc += wj[j];
        }
        unsigned long long tot;
        const unsigned long long ex = block_excl_scan(sh, loc, &tot);
        if (loc > 0 && rem >= ex && rem < ex + loc) {
          unsigned long long cum = ex;
#pragma unroll
          for (int j = 0; j < kPer; ++j) {
            cum += wj[j];
            if (cum > rem) {
              s_token = int(q0 + j);
              break;
            }
          }
        }
        __syncthreads();
        if (s_token >= 0) token = s_token;
      }
    }
  }
  if (threadIdx.x == 0) {
    a.tokens[r] = token;
    if (a.logprobs) a.logprobs[r] = (__ldcg(row + token) - m) - logZ;
  }
  // top-n: n rounds over the chunks' candidate lists (staged in shared memory when they fit)
  const int64_t ncand = w.C * n;
  const float* cv = w.topv + r * w.C * n;
  const int* ci = w.topi + r * w.C * n;
  const bool staged = ncand <= kStage;
  if (n > 0 && staged) {
    for (int64_t q = threadIdx.x; q < ncand; q += kThreads) stage_v[q] = __ldcg(cv + q), stage_i[q] = __ldcg(ci + q);
    __syncthreads();
  }
  float pv = INFINITY;
  int pi = -1;
  for (int k = 0; k < n; ++k) {
    float v = -INFINITY;
    int vi = INT32_MAX;
    for (int64_t q = threadIdx.x; q < ncand; q += kThreads) {
      const float s = staged ? stage_v[q] : __ldcg(cv + q);
      const int i = staged ? stage_i[q] : __ldcg(ci + q);
      const bool after = s < pv || (s == pv && i > pi);
      if (after && better(s, i, v, vi)) v = s, vi = i;
    }
    block_argmax(sh, v, vi);
    if (threadIdx.x == 0) {
      a.top_ids[r * n + k] = vi == INT32_MAX ? -1 : vi;
      a.top_logprobs[r * n + k] = (v - m) - logZ;
    }
    pv = v, pi = vi;
  }
}

// A launch with programmatic stream serialization (the kernel starts with pdl_enter), plain
// where that is refused; GPUKIT_SAMPLING_PDL=0 launches plainly (comparison).
template <class... P, class... A>
void launch_pdl(void (*kern)(P...), dim3 grid, cudaStream_t st, const char* what, const A&... args) {
  const char* e = std::getenv("GPUKIT_SAMPLING_PDL");
  const bool off = e && e[0] == '0';
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(unsigned(kThreads), 1u, 1u);
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = off ? 0 : 1;
  if (cudaLaunchKernelEx(&cfg, kern, args...) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it and launch plainly
    kern<<<grid, kThreads, 0, st>>>(args...);
  }
  GK_LAUNCH_CHECK(what);
}

template <int which>
void launch_select(const SampleArgs& a, const Ws& w, dim3 grid, cudaStream_t st, int first_level = 0) {
  for (int lv = first_level; lv < 3; ++lv) launch_pdl(k_select<which>, grid, st, "sampling_select", a, w, lv);
}

}  // namespace

int64_t sample_work_stride(int64_t V) { return (V + 3) / 4 * 4; }  // 16-byte rows
int64_t sample_workspace_bytes(const SampleArgs& a) { return ws_bytes(a.B, a.V, a.top_n); }

void sample_rows(const SampleArgs& a, void* stream) {
  if (fused_sample_ok(a)) return fused_sample_rows(a, stream);  // one launch (src/cuda/sampling_fused.cu)
  auto st = static_cast<cudaStream_t>(stream);
  if (a.B > 65535) throw ValueError(cat("logits: at most 65535 rows per call on CUDA, got ", a.B));
  const Ws w = ws_layout(a.ws, a.B, a.V, a.top_n);
  const dim3 grid(unsigned(w.C), unsigned(a.B));
  if (a.mode != SampleMode::Process) GK_CUDA_CHECK(cudaMemsetAsync(a.ws, 0, size_t(zero_bytes(a.B)), st));
  // Filters that some row may use (per-row arrays: any value; scalars: the row_cfg rule)
  const bool draw = a.mode != SampleMode::Process;
  const bool any_temp = a.mode == SampleMode::Filter || a.temperature.ptr || a.temperature.value > 0.f;
  const bool topk = draw && any_temp && (a.top_k.ptr || (a.top_k.value > 0 && a.top_k.value < a.V));
  const bool topp = a.top_p.ptr || (a.top_p.value > 0.f && a.top_p.value < 1.f);
  const bool typ = a.typical_p.ptr || (a.typical_p.value > 0.f && a.typical_p.value < 1.f);
  switch (a.dtype) {
    case DType::f32: k_process<float><<<grid, kThreads, 0, st>>>(a, w, topk); break;
    case DType::bf16: k_process<bf16><<<grid, kThreads, 0, st>>>(a, w, topk); break;
    case DType::f16: k_process<f16><<<grid, kThreads, 0, st>>>(a, w, topk); break;
    default: throw TypeError("logits: dtype must be float32, bfloat16 or float16");
  }
  GK_LAUNCH_CHECK("sampling_process");
  if (!draw) return;
  if (any_temp) {
    if (topk) launch_select<kTopK>(a, w, grid, st, 1);  // level 0 ran in k_process
    if (topp) launch_select<kTopP>(a, w, grid, st);
    if (typ) {
      launch_pdl(k_typstats, grid, st, "sampling_typical", a, w);
      launch_select<kTyp>(a, w, grid, st);
    }
  }
  launch_pdl(k_final, grid, st, "sampling_final", a, w);
}

}  // namespace gk::cuda
