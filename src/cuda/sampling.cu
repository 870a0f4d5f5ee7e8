// CUDA sampling: the fused decode step (and the processors / filters / sample ops
// that share it). Two launches, no host synchronization, graph-capturable:
//  1. k_prep, grid (chunks, B): logits (f32/bf16/f16, strided rows) -> f32 work row,
//     NaN -> -inf, +inf -> FLT_MAX, logit bias added; zeroes the history counters.
//  2. k_row, one 1024-thread block per row: penalties over the history (exact
//     integer counts: atomicAdd, then atomicExch so each distinct token is
//     penalized once), bans and EOS, temperature, max/argmax, then the filters as
//     radix selects over the float order keys with integer (fixed-point) masses,
//     and the draw as an ordered block scan of the kept masses in vocabulary order.
// Every pass of k_row reads the row from L2; deterministic: fixed reduction trees,
// integer atomics only (float sums never use atomics).
#include <cfloat>

#include "core/cuda_util.h"
#include "cuda/common/sampling.cuh"
#include "ops/backend.h"
#include "ops/philox.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("sampling.argmax", "sampling.topk", "sampling.apply_temperature", "sampling.apply_penalties",
                     "sampling.apply_logit_bias", "sampling.ban_tokens", "sampling.apply_min_tokens",
                     "sampling.top_k_filter", "sampling.top_p_filter", "sampling.min_p_filter",
                     "sampling.typical_p_filter", "sampling.sample", "sampling.decode_step");

namespace {

using namespace smpk;
constexpr int kPrepThreads = 256;
constexpr int kPrepChunk = kPrepThreads * 16;

template <class T>
__global__ void __launch_bounds__(kPrepThreads) k_prep(SampleArgs a) {
  const int64_t r = blockIdx.y;
  const T* in = static_cast<const T*>(a.logits) + r * a.row_stride;
  float* w = a.work + r * a.V;
  const float* bias = a.bias ? a.bias + r * a.bias_row_stride : nullptr;
  int32_t* cnt = a.counts ? a.counts + r * a.V : nullptr;
  const int64_t lim = (int64_t(blockIdx.x) + 1) * kPrepChunk;
  const int64_t end = lim < a.V ? lim : a.V;
  for (int64_t i = int64_t(blockIdx.x) * kPrepChunk + threadIdx.x; i < end; i += kPrepThreads) {
    float x = smp::sanitize(float(in[i]));
    if (bias) x += bias[i];
    w[i] = x;
    if (cnt) cnt[i] = 0;
  }
}

__device__ void fail_row(const SampleArgs& a, int64_t r) {
  if (a.out)
    for (int64_t i = threadIdx.x; i < a.V; i += kRowThreads) a.out[r * a.V + i] = -INFINITY;
  if (threadIdx.x == 0) {
    if (a.tokens) a.tokens[r] = -1;
    if (a.logprobs) a.logprobs[r] = NAN;
    for (int j = 0; j < a.top_n; ++j) a.top_ids[r * a.top_n + j] = -1, a.top_logprobs[r * a.top_n + j] = NAN;
  }
}

__device__ __forceinline__ void apply_processors(const SampleArgs& a, int64_t r, float* x, const smp::RowCfg& c) {
  const int64_t V = a.V;
  if (a.history) {
    int64_t len = a.hist_len.at(r);
    len = len < 0 ? 0 : (len > a.hist_max ? a.hist_max : len);
    const int32_t* h = a.history + r * a.hist_stride;
    int32_t* cnt = a.counts + r * V;
    for (int64_t j = threadIdx.x; j < len; j += kRowThreads) {
      int32_t t = h[j];
      if (t >= 0 && t < V) atomicAdd(&cnt[t], 1);
    }
    __syncthreads();
    for (int64_t j = threadIdx.x; j < len; j += kRowThreads) {
      int32_t t = h[j];
      if (t < 0 || t >= V) continue;
      int n = atomicExch(&cnt[t], 0);  // exactly one entry per distinct token gets its count
      if (n > 0) x[t] = smp::penalize(x[t], n, c.rep, c.presence, c.frequency);
    }
    __syncthreads();
  }
  if (a.banned)
    for (int64_t j = threadIdx.x; j < a.n_banned; j += kRowThreads) {
      int32_t t = a.banned[r * a.banned_row_stride + j];
      if (t >= 0 && t < V) x[t] = -INFINITY;
    }
  if (a.eos && a.generated.at(r) < a.min_tokens.at(r))
    for (int64_t j = threadIdx.x; j < a.n_eos; j += kRowThreads) {
      int32_t t = a.eos[j];
      if (t >= 0 && t < V) x[t] = -INFINITY;
    }
  __syncthreads();
}

// Draw: the first kept id (vocabulary order) whose inclusive prefix of w exceeds t.
// Three levels, all exact integer sums: (1) each warp sums a contiguous chunk of
// the row (coalesced), the chunk holding t is found from the 32 totals; (2) that
// warp splits its chunk over its lanes and a warp scan finds the lane; (3) the
// warp scans that lane's sub-chunk 32 entries at a time.
template <class Kept>
__device__ __forceinline__ int64_t ordered_pick(Shared& sh, const float* x, int64_t V, float m, unsigned long long t,
                                                Kept kept) {
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  const int64_t chunk = (V + kWarps - 1) / kWarps;
  const int64_t c0 = min(V, int64_t(w) * chunk), c1 = min(V, c0 + chunk);
  auto wt = [&](float s) -> unsigned long long { return kept(s) ? smp::weight_of(smp::rel_exp(s, m)) : 0ull; };
  __syncthreads();
  if (threadIdx.x == 0) sh.flag = -1;
  unsigned long long loc = 0;
#pragma unroll 8
  for (int64_t i = c0 + l; i < c1; i += 32) loc += wt(x[i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) loc += __shfl_xor_sync(0xffffffffu, loc, o);
  if (l == 0) sh.wsum[w] = loc;
  __syncthreads();
  unsigned long long acc = 0;
  int fw = -1;
  for (int k = 0; k < kWarps; ++k) {
    if (t < acc + sh.wsum[k]) {
      fw = k;
      break;
    }
    acc += sh.wsum[k];
  }
  if (w == fw) {
    const unsigned long long tw = t - acc;
    const int64_t sub = (c1 - c0 + 31) / 32;
    const int64_t s0 = min(c1, c0 + int64_t(l) * sub), s1 = min(c1, s0 + sub);
    unsigned long long ls = 0;
#pragma unroll 8
    for (int64_t i = s0; i < s1; ++i) ls += wt(x[i]);
    unsigned long long inc = ls;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      unsigned long long n = __shfl_up_sync(0xffffffffu, inc, o);
      if (l >= o) inc += n;
    }
    const unsigned long long ex = inc - ls;
    const unsigned ball = __ballot_sync(0xffffffffu, ls > 0 && tw >= ex && tw < inc);
    if (ball) {
      const int fl = __ffs(ball) - 1;
      unsigned long long t3 = tw - __shfl_sync(0xffffffffu, ex, fl);
      const int64_t q0 = __shfl_sync(0xffffffffu, s0, fl), q1 = __shfl_sync(0xffffffffu, s1, fl);
      for (int64_t i0 = q0; i0 < q1; i0 += 32) {
        const int64_t i = i0 + l;
        const unsigned long long v = i < q1 ? wt(x[i]) : 0ull;
        unsigned long long in2 = v;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          unsigned long long n = __shfl_up_sync(0xffffffffu, in2, o);
          if (l >= o) in2 += n;
        }
        const unsigned hit = __ballot_sync(0xffffffffu, v > 0 && t3 >= in2 - v && t3 < in2);
        if (hit) {
          if (l == 0) sh.flag = int(i0 + __ffs(hit) - 1);
          break;
        }
        t3 -= __shfl_sync(0xffffffffu, in2, 31);
      }
    }
  }
  __syncthreads();
  const int f = sh.flag;
  __syncthreads();
  return f;
}

__global__ void __launch_bounds__(kRowThreads, 1) k_row(SampleArgs a) {
  __shared__ Shared sh;
  const int64_t r = blockIdx.x, V = a.V;
  float* x = a.work + r * V;
  const smp::RowCfg c = smp::row_cfg(a, r);
  apply_processors(a, r, x, c);

  if (a.mode == SampleMode::Process) {
    const bool scale = a.scale_by_temperature && !c.greedy;
    for (int64_t i = threadIdx.x; i < V; i += kRowThreads) a.out[r * V + i] = scale ? x[i] / c.temp : x[i];
    return;
  }
  // temperature (in place), max and argmax (ties -> lowest index)
  float bv = -INFINITY;
  int bi = INT32_MAX;
  const bool scale = !c.greedy && c.temp != 1.f;
  auto track = [&](int64_t i, float s) {
    if (better(s, int(i), bv, bi)) bv = s, bi = int(i);
  };
  if (scale) {
    row_transform(x, V, [&](int64_t i, float s) {
      s = smp::finite_top(s / c.temp);
      track(i, s);
      return s;
    });
  } else {  // FLT_MAX stands for +inf already (k_prep); only overflowed values change
    row_for_each(x, V, [&](int64_t i, float s) {
      if (s == INFINITY) x[i] = s = FLT_MAX;
      track(i, s);
    });
  }
  block_argmax(sh, bv, bi);  // syncs: x is final for the whole block
  const float m = bv;
  if (m == -INFINITY) return fail_row(a, r);
  int64_t token = bi;
  auto weight = [m](int64_t, float s) -> unsigned long long { return smp::weight_of(smp::rel_exp(s, m)); };

  if (!c.greedy || a.mode == SampleMode::Filter) {
    uint32_t kk = 0, kp = 0, kt = 0;
    unsigned long long Wsel = 0;  // kept mass when only top-k / top-p are active
    bool wsel_valid = false;
    if (c.top_k) {
      kk = radix_select(
               sh, x, V, [&](unsigned long long) { return (unsigned long long)c.top_k; },
               [](int64_t, float s, uint32_t& key) { key = smp::order_key(s); return true; },
               [](int64_t, float) { return 1ull; })
               .key;
    }
    if (c.top_p < 1.f) {
      Selected sp = radix_select(
          sh, x, V, [&](unsigned long long tot) { return (unsigned long long)smp::frac_target(c.top_p, tot); },
          [kk](int64_t, float s, uint32_t& key) { key = smp::order_key(s); return key >= kk; }, weight);
      kp = sp.key;
      Wsel = sp.mass;
      wsel_valid = c.min_p == 0.f;  // exact kept mass unless min-p removes more
    }
    const uint32_t kv = kk > kp ? kk : kp;
    const float minp = c.min_p;
    auto kept1 = [=](float s) { return smp::order_key(s) >= kv && (minp == 0.f || smp::rel_exp(s, m) >= minp); };
    double mean = 0;
    const bool typ = c.typical < 1.f;
    if (typ) {
      unsigned long long wl = 0;
      long long sl = 0;
      row_for_each(x, V, [&](int64_t, float s) {
        if (!kept1(s)) return;
        uint64_t w = smp::weight_of(smp::rel_exp(s, m));
        wl += w;
        if (w) sl += smp::weighted_logit(w, s - m);
      });
      const unsigned long long W1 = block_sum_u(sh, wl);
      const long long S1 = (long long)block_sum_u(sh, (unsigned long long)sl);  // two's complement: exact
      mean = double(S1) / double(W1);
      Selected st = radix_select(
          sh, x, V, [&](unsigned long long tot) { return (unsigned long long)smp::frac_target(c.typical, tot); },
          [=](int64_t, float s, uint32_t& key) {
            key = smp::typical_key(s - m, mean);
            return kept1(s);
          },
          weight);
      kt = st.key;
      Wsel = st.mass;  // over kept1 entries: exactly the kept mass
      wsel_valid = true;
    }
    auto kept = [=](float s) { return kept1(s) && (!typ || smp::typical_key(s - m, mean) >= kt); };
    if (a.mode == SampleMode::Filter) {
      for (int64_t i = threadIdx.x; i < V; i += kRowThreads) a.out[r * V + i] = kept(x[i]) ? x[i] : -INFINITY;
      return;
    }
    unsigned long long W;
    if (wsel_valid) {
      W = Wsel;  // the last select's mass is exactly the kept mass
    } else {
      unsigned long long wl = 0;
      row_for_each(x, V, [&](int64_t, float s) {
        if (kept(s)) wl += smp::weight_of(smp::rel_exp(s, m));
      });
      W = block_sum_u(sh, wl);
    }
    if (W > 0) {
      const uint32_t tag = a.row_tag_is_index ? uint32_t(r) : 0u;
      const uint64_t bits = philox::draw_bits(uint64_t(a.seed.at(r)), uint64_t(a.position.at(r)), tag);
      const int64_t p = ordered_pick(sh, x, V, m, smp::scale_draw(W, bits), kept);
      if (p >= 0) token = p;
    }
  }
  if (a.logprobs || a.top_n > 0) {
    float zl = 0.f;
    row_for_each(x, V, [&](int64_t, float s) { zl += smp::rel_exp(s, m); });
    const float logZ = logf(block_sum_f(sh, zl));
    if (threadIdx.x == 0 && a.logprobs) a.logprobs[r] = (x[token] - m) - logZ;
    float pv = INFINITY;
    int pi = -1;
    for (int j = 0; j < a.top_n; ++j) {  // n rounds of "next best after (pv, pi)"
      float v = -INFINITY;
      int vi = INT32_MAX;
      row_for_each(x, V, [&](int64_t i, float s) {
        const bool after = s < pv || (s == pv && int(i) > pi);
        if (after && better(s, int(i), v, vi)) v = s, vi = int(i);
      });
      block_argmax(sh, v, vi);
      if (threadIdx.x == 0) {
        a.top_ids[r * a.top_n + j] = vi == INT32_MAX ? -1 : vi;
        a.top_logprobs[r * a.top_n + j] = (v - m) - logZ;
      }
      pv = v, pi = vi;
    }
  }
  if (threadIdx.x == 0) a.tokens[r] = int32_t(token);
}

}  // namespace

void sample_rows(const SampleArgs& a, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  if (a.B > 65535) throw ValueError(cat("logits: at most 65535 rows per call on CUDA, got ", a.B));
  dim3 grid(unsigned((a.V + kPrepChunk - 1) / kPrepChunk), unsigned(a.B));
  switch (a.dtype) {
    case DType::f32: k_prep<float><<<grid, kPrepThreads, 0, st>>>(a); break;
    case DType::bf16: k_prep<bf16><<<grid, kPrepThreads, 0, st>>>(a); break;
    case DType::f16: k_prep<f16><<<grid, kPrepThreads, 0, st>>>(a); break;
    default: throw TypeError("logits: dtype must be float32, bfloat16 or float16");
  }
  GK_LAUNCH_CHECK("sampling_prep");
  k_row<<<unsigned(a.B), kRowThreads, 0, st>>>(a);
  GK_LAUNCH_CHECK("sampling_row");
}

}  // namespace gk::cuda
