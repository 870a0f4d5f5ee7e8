// CUDA sampling, fused path: the whole decode step (processors, temperature, top-k,
// top-p, min-p, the draw, the chosen token's logprob) in ONE launch, one thread-block
// cluster per row (Hopper). Each CTA of the cluster owns a contiguous slice of the
// row, reads its logits from global memory once into shared memory, and every later
// pass runs on-chip:
//  1. load + process: history counts / bans are first accumulated with integer atomics
//     in the slice's shared words, then each word is replaced by the processed logit
//     (the same thread reads the count and writes the value); local max/argmax.
//     Cluster exchange of (max, argmax) through distributed shared memory.
//  2. radix selects on the 32-bit order key with 8-bit digits (up to 4 levels): per-group
//     integer histograms (mass split in two 32-bit words, no 64-bit shared atomics); each
//     lane keeps a run (bin, mass, count) flushed when the bin changes; the deeper levels
//     take each lane's selected entries from a bit mask. Merged per CTA, summed over the
//     cluster through DSMEM;
//     every CTA picks the same bin (identical data, fixed rule), so no broadcast is
//     needed. top-k by count, then top-p by integer mass over the top-k set. A select
//     stops at the first level whose picked bin is kept whole (the count target is the
//     whole bin, or the bin holds one weighted entry): the threshold is then the bin's
//     lowest key, the kept set the same. Where the slice has room for a second array
//     (few rows), top-p's level 0 caches every relative exp for the later passes.
//  3. final pass: each thread's kept mass over its contiguous entries, block scan,
//     cluster exchange of the CTA masses (vocabulary order = rank order), Philox draw,
//     the owning thread's warp scans its entries 32 at a time for the token.
// Everything that decides a token is an exact integer (weights, masses, counts) or a
// max, so the result does not depend on the partition: the cluster size may follow the
// batch size. The logprob normalizer is the exact integer sum of the weights too
// (Z = sum floor(exp(s - m) 2^40), logZ = log Z - 40 ln 2), as in the multi-pass path.
// Falls back (fused_sample_ok false) for Filter / Process modes, typical-p, top-n
// logprobs and vocabularies whose slice does not fit in shared memory.
#include <cooperative_groups.h>

#include <cfloat>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "core/cuda_util.h"
#include "ops/backend.h"
#include "ops/philox.h"
#include "ops/sampling_args.h"
#include "cuda/common/sampling_cluster.cuh"
#include "cuda/common/sampling_fused_load.cuh"
#include "cuda/common/sampling_fused_cfg.cuh"

namespace gk::cuda {

namespace {
using namespace fused;

// ---------------------------------------------------------------- the kernel
template <class T, int NT>
__global__ void __launch_bounds__(NT, NT >= 1024 ? 1 : 2) k_fused(SampleArgs a, FGeo g) {
  constexpr int kNT = NT;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // clusters need sm_90; the host never launches this on older devices
#else
  // programmatic dependent launch (no-ops on a plain launch): wait for the previous kernel's
  // grid and memory before touching anything, then let the next kernel's CTAs be scheduled
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  extern __shared__ uint4 dyn_smem[];
  uint32_t* vals = reinterpret_cast<uint32_t*>(dyn_smem);
  __shared__ Sh<NT> sh;
  const cg::cluster_group cl = cg::this_cluster();
  const int CL = g.CL;
  const int rank = int(cl.block_rank());
  const int64_t r = blockIdx.y, V = a.V;
  const int64_t c0 = int64_t(rank) * g.S;
  const int n = int(c0 < V ? (V - c0 < g.S ? V - c0 : g.S) : 0);  // entries of this slice
  const smp::RowCfg c = smp::row_cfg(a, r);
  const int t = threadIdx.x;
  constexpr int G = 16 / int(sizeof(T));
  const T* in = static_cast<const T*>(a.logits) + r * a.row_stride + c0;
  const bool aligned = g.aligned != 0;

  // ---- 1. load (first batch issued before the history phase) + process
  uint4 q[kU];
  auto load_slot = [&](int bt, int u) -> uint4 {
    const int64_t e = (int64_t(bt) * kU * kNT + int64_t(u) * kNT + t) * G;
    return e < n ? load_group(in, e, n, aligned) : make_uint4(0u, 0u, 0u, 0u);
  };
  auto load_batch = [&](int bt) {
#pragma unroll
    for (int u = 0; u < kU; ++u) q[u] = load_slot(bt, u);
  };
  load_batch(0);
  const bool eos_on = a.eos && a.generated.at(r) < a.min_tokens.at(r);
  const bool marks = a.history || a.banned || eos_on;
  if (marks) mark_slice<NT>(a, r, vals, c0, n, t, eos_on);
  const float* bias = a.bias ? a.bias + r * a.bias_row_stride + c0 : nullptr;
  float bv = -INFINITY, bmn = INFINITY;
  int bi = INT_MAX;
  // rotated order: in step k, lane l takes entry (k + l / (32 / G)) mod G of its group, so the
  // 32 lanes' shared-memory words (G apart per lane) fall in 32 different banks
  const int rot = g.rot ? (t & 31) / (32 / G) : 0;
  const int c0i = int(c0);
  const int nbatch = int((int64_t(n) + int64_t(kU) * kNT * G - 1) / (int64_t(kU) * kNT * G));
  // pipelined (g.pipe): the next batch's loads go out two slots at a time as soon as those
  // slots are processed, so they are in flight while the rest of this batch is processed
  const bool pipe = g.pipe != 0;
  for (int bt = 0; bt < nbatch; ++bt) {
    if (bt > 0 && !pipe) load_batch(bt);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (pipe && u >= 2 && bt + 1 < nbatch) q[u - 2] = load_slot(bt + 1, u - 2);  // (slot u - 2 is done)
      const int e = (bt * kU * kNT + u * kNT + t) * G;  // (32-bit: a slice holds < 2^20 entries)
      const uint4 qr = rotate_group<T>(q[u], rot);     // (no runtime index into q: it would go to local memory)
#pragma unroll
      for (int k0 = 0; k0 < G; ++k0) {
        const int k = (k0 + rot) & (G - 1);
        const int i = e + k;
        if (i >= n) continue;
        float x = smp::sanitize(elem<T>(qr, k0));
        if (bias) x = smp::fadd_rn(x, bias[i]);
        if (marks) {
          const int mk = int(vals[i]);
          if (mk & kCntMask) x = smp::penalize(x, mk & kCntMask, c.rep, c.presence, c.frequency);
          if (mk & kBan) x = -INFINITY;
        }
        const float s = smp::finite_top(c.greedy ? x : x / c.temp);
        vals[i] = __float_as_uint(s);
        if (better(s, c0i + i, bv, bi)) bv = s, bi = c0i + i;
        if (s > -INFINITY) bmn = fminf(bmn, s);
      }
    }
    if (pipe && bt + 1 < nbatch)
#pragma unroll
      for (int u = kU - 2; u < kU; ++u) q[u] = load_slot(bt + 1, u);
  }
  for (int k = t; k < Sh<NT>::kHG * Sh<NT>::kHS; k += kNT) (&sh.hi[0][0])[k] = 0u, (&sh.lo[0][0])[k] = 0u;
  if (t < kBins) sh.cnt[t] = 0u;
  if (t < 2) sh.lmn[t] = 0xffffffffu, sh.lmx[t] = 0u;
  block_argmax(sh, bv, bi);
  if (g.stop == 1) {  // probe: load + process only
    if (rank == 0 && t == 0) a.tokens[r] = bi;
    return;
  }
  const bool want_mn = g.qsel && !c.greedy && c.top_p < 1.f;  // (row-uniform)
  if (want_mn) {  // the smallest finite processed logit (the linear keys' window)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) bmn = fminf(bmn, __shfl_xor_sync(0xffffffffu, bmn, o));
    if ((t & 31) == 0) sh.fv[t >> 5] = bmn;
    __syncthreads();
    if (t == 0) {
      float v = sh.fv[0];
#pragma unroll
      for (int k = 1; k < Sh<NT>::kW; ++k) v = fminf(v, sh.fv[k]);
      sh.xmn = v;
    }
  }
  if (t == 0) sh.xm = bv, sh.xi = bi;
  cl.sync();  // also orders the vals writes before the contiguous passes
  if (t < 32) {  // lane q reads CTA q's (max, argmax): all loads at once, then a warp argmax
    float v = -INFINITY, mn = INFINITY;
    int vi = INT_MAX;
    if (t < CL) {
      const Sh<NT>* o = cl.map_shared_rank(&sh, t);
      v = o->xm, vi = o->xi;
      if (want_mn) mn = o->xmn;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oi = __shfl_xor_sync(0xffffffffu, vi, o);
      if (better(ov, oi, v, vi)) v = ov, vi = oi;
      mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
    }
    if (t == 0) sh.gm = v, sh.gam = vi, sh.gmn = mn;
  }
  __syncthreads();
  const float m = sh.gm;
  const int am = sh.gam;
  if (g.stop == 2) {  // probe: + the cluster max exchange
    cl.sync();
    if (rank == 0 && t == 0) a.tokens[r] = am;
    return;
  }
  if (m == -INFINITY) {  // no finite logit in the row
    cl.sync();
    if (rank == 0 && t == 0) {
      a.tokens[r] = -1;
      if (a.logprobs) a.logprobs[r] = NAN;
    }
    return;
  }

  // ---- 2. selects
  const int i0 = t * g.E, i1 = i0 + g.E < n ? i0 + g.E : n;
  const bool want_z = a.logprobs != nullptr;
  const bool topk = !c.greedy && c.top_k > 0;
  const bool topp = !c.greedy && c.top_p < 1.f;
  int buf = 0;
  unsigned long long zl = 0;
  uint32_t kk = 0, kp = 0;
  bool done = false;
  unsigned long long kept_local = 0;
  const bool early = g.early != 0, compact = g.compact != 0, cmask = g.cmask != 0;
  // the relative exps cached by the top-p select (level 0 computes every weight it needs)
  float* const ec = g.cache && topp ? reinterpret_cast<float*>(vals + int64_t(g.E) * kNT) : nullptr;
  if (t == 0) sh.qm = g.qsel && topp ? make_qmap(m, sh.gmn) : QMap{0.f, 0.f, 0}, sh.keep = Keep{0u, 0u, 0u, 0u, 0, sh.qm};
  __syncthreads();
  if (topk)
    kk = radix_select<NT, false>(sh, cl, CL, vals, i0, g.E, n, m, 0u, 1.f, (unsigned long long)c.top_k, buf, nullptr,
                                 nullptr, done, early, nullptr, compact, V, cmask);
  // ts: this thread's weights over key >= kk, summed by the top-p select's level 0 (g.tmask)
  unsigned long long ts = 0;
  const bool ts_ok = topp && !ec && g.tmask != 0;
  if (topp && sh.qm.on)
    radix_select_q<NT>(sh, cl, CL, vals, i0, g.E, n, m, kk, c.top_p, buf, want_z ? &zl : nullptr, &kept_local, done,
                       early, ec, compact, V, sh.qm, sh.keep, cmask, ts_ok ? &ts : nullptr);
  else if (topp)
    kp = radix_select<NT, true>(sh, cl, CL, vals, i0, g.E, n, m, kk, c.top_p, 0ull, buf, want_z ? &zl : nullptr,
                                &kept_local, done, early, ec, compact, V, cmask, ts_ok ? &ts : nullptr);
  if (t == 0) sh.keep.kk = kk, sh.keep.kp = kp;
  __syncthreads();
  const Keep& keep = sh.keep;
  if (g.stop == 3) {  // probe: + the selects
    cl.sync();
    if (rank == 0 && t == 0) a.tokens[r] = am;
    return;
  }
  // top-p's histograms already give each CTA its kept mass (key >= kp, kp >= kk): then only
  // the CTA that holds the draw scans its entries (unless min-p adds a per-entry test)
  const bool hist_mass = topp && done && !(c.min_p != 0.f);
  if (want_z && !topp)
#pragma unroll 4
    for (int i = i0; i < i1; ++i) zl += weight_nb(val(vals, i), m);

  // ---- 3. kept masses, cluster exchange, draw
  const float minp = c.greedy ? 0.f : c.min_p;
  auto thread_mass = [&]() {  // this thread's kept mass (its entries are contiguous); 4 at a time
    unsigned long long acc = 0;
    if (ec) {  // relative exps cached by the top-p select (0 below the live range)
      for (int j = 0; j < g.E; ++j) {
        const int idx = i0 + j;
        if (idx >= n) break;
        const float e = ec[idx];
        const bool need = keep(val(vals, idx)) && (minp == 0.f || e >= minp);
        acc += need ? weight_of_e(e) : 0ull;
      }
      return acc;
    }
    if (ts_ok) {
      // the top-p select's level 0 summed this thread's weights over key >= kk (ts): the kept
      // mass is the sum over the kept entries or ts less the sum over the others, whichever
      // set is smaller; each lane takes its next entry of that set per round (a mask: E <= 63)
      unsigned long long min_ = 0, mout = 0;
      for (int j = 0; j < g.E; ++j) {
        const int idx = i0 + j;
        if (idx >= n) break;
        const float sv = val(vals, idx);
        if (!(smp::fsub_rn(sv, m) >= -28.f)) continue;  // weight 0
        if (keep(sv)) min_ |= 1ull << j;
        else if (smp::order_key(sv) >= keep.kk) mout |= 1ull << j;
      }
      const bool out = minp == 0.f && __popcll(mout) < __popcll(min_);
      unsigned long long msk = out ? mout : min_;
      while (__any_sync(0xffffffffu, msk != 0)) {
        if (msk) {
          const int idx = i0 + __ffsll(static_cast<long long>(msk)) - 1;
          msk &= msk - 1;
          float e;
          const unsigned long long wv = weight_nb(val(vals, idx), m, &e);
          acc += out || minp == 0.f || e >= minp ? wv : 0ull;
        }
      }
      return out ? ts - acc : acc;
    }
    for (int j = 0; j < g.E; j += 4) {
      float sv[4];
      bool need[4];
      bool any = false;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int idx = i0 + j + u;
        const bool valid = j + u < g.E && idx < n;
        sv[u] = valid ? val(vals, idx) : -INFINITY;
        need[u] = valid && smp::fsub_rn(sv[u], m) >= -28.f && keep(sv[u]);
        any |= need[u];
      }
      if (__all_sync(0xffffffffu, need[0] && need[1] && need[2] && need[3])) {  // dense: interleaved
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          float e;
          const unsigned long long wv = weight_nb(sv[u], m, &e);
          acc += need[u] && (minp == 0.f || e >= minp) ? wv : 0ull;
        }
      } else if (__any_sync(0xffffffffu, any)) {  // sparse: only entries some lane needs
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          if (!__any_sync(0xffffffffu, need[u])) continue;
          float e;
          const unsigned long long wv = weight_nb(sv[u], m, &e);
          acc += need[u] && (minp == 0.f || e >= minp) ? wv : 0ull;
        }
      }
    }
    return acc;
  };
  unsigned long long mt = 0, ex = 0, ctot = 0;
  if (!c.greedy) {
    if (hist_mass) ctot = kept_local;
    else ex = block_scan(sh, mt = thread_mass(), &ctot);
  }
  if (want_z) zl = block_sum(sh, zl);
  if (t == 0) sh.xw = ctot, sh.xz = zl;
  cl.sync();
  if (t < 32) {  // lane q reads CTA q's kept mass and normalizer
    unsigned long long wk = 0, zk = 0;
    if (t < CL) {
      const Sh<NT>* o = cl.map_shared_rank(&sh, t);
      wk = o->xw, zk = want_z ? o->xz : 0ull;
    }
    unsigned long long wb = t < rank ? wk : 0ull;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      wk += __shfl_xor_sync(0xffffffffu, wk, o);
      zk += __shfl_xor_sync(0xffffffffu, zk, o);
      wb += __shfl_xor_sync(0xffffffffu, wb, o);
    }
    if (t == 0) sh.gW = wk, sh.gZ = zk, sh.gpre = wb;
  }
  __syncthreads();
  const unsigned long long W = sh.gW, pre = sh.gpre, Z = sh.gZ;
  // no CTA leaves while another still reads its shared memory: arrive now (this CTA's remote
  // reads are done), wait before leaving, so the drawing CTA's work overlaps the barrier
  cl.barrier_arrive();
  const float logZ = want_z ? float(log(double(Z)) - kLn2x40) : 0.f;
  if (c.greedy || W == 0) {
    if (rank == 0 && t == 0) {
      a.tokens[r] = am;
      if (a.logprobs) a.logprobs[r] = 0.f - logZ;  // (s[argmax] - m) - logZ, as the multi-pass path (+0, not -0)
    }
    cl.barrier_wait();
    return;
  }
  const uint32_t tag = a.row_tag_is_index ? uint32_t(r) : 0u;
  const uint64_t bits = philox::draw_bits(uint64_t(a.seed.at(r)), uint64_t(a.position.at(r)), tag);
  const unsigned long long tt = smp::scale_draw(W, bits);
  if (!(tt >= pre && tt < pre + ctot)) {  // another CTA holds the token (CTA-uniform)
    cl.barrier_wait();
    return;
  }
  if (hist_mass) {
    unsigned long long tot2;
    ex = block_scan(sh, mt = thread_mass(), &tot2);
  }
  const unsigned long long rem = tt - pre;
  if (t == 0) sh.pick = INT_MAX;
  __syncthreads();
  // the thread whose entries hold the draw; its warp scans them 32 at a time (weights as in
  // thread_mass, an inclusive warp scan, the first lane whose cumulative mass passes rem)
  const unsigned own = __ballot_sync(0xffffffffu, mt > 0 && rem >= ex && rem < ex + mt);
  if (own) {
    const int lane = t & 31, ol = __ffs(own) - 1;
    const int oi0 = __shfl_sync(0xffffffffu, i0, ol);
    unsigned long long base = __shfl_sync(0xffffffffu, ex, ol);
    for (int j0 = 0; j0 < g.E; j0 += 32) {
      const int i = oi0 + j0 + lane;
      const bool valid = j0 + lane < g.E && i < n;
      const float s = valid ? val(vals, i) : -INFINITY;
      float e;
      unsigned long long wv;
      if (ec) e = valid ? ec[i] : 0.f, wv = weight_of_e(e);
      else wv = weight_nb(s, m, &e);
      const bool in = valid && keep(s) && smp::fsub_rn(s, m) >= -28.f && (minp == 0.f || e >= minp);
      unsigned long long inc = in ? wv : 0ull;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long nb = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += nb;
      }
      const unsigned hit = __ballot_sync(0xffffffffu, in && wv > 0 && base + inc > rem);
      if (hit) {
        if (lane == __ffs(hit) - 1) {
          sh.pick = i;
          a.tokens[r] = int(c0 + i);
          if (a.logprobs) a.logprobs[r] = (s - m) - logZ;
        }
        break;
      }
      base += __shfl_sync(0xffffffffu, inc, 31);
    }
  }
  __syncthreads();
  if (t == 0 && sh.pick == INT_MAX) {  // unreachable unless the masses disagree: never leave garbage
    a.tokens[r] = am;
    if (a.logprobs) a.logprobs[r] = 0.f - logZ;
  }
  cl.barrier_wait();
#endif
}

// ---------------------------------------------------------------- host side
// (shape and knobs: src/cuda/common/sampling_fused_cfg.cuh)

template <class T, int NT>
void set_attrs() {
  static bool done = false;  // function attributes: set once (the same for every launch)
  if (done) return;
  GK_CUDA_CHECK(cudaFuncSetAttribute(k_fused<T, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxDyn)));
  GK_CUDA_CHECK(cudaFuncSetAttribute(k_fused<T, NT>, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  GK_CUDA_CHECK(cudaFuncSetAttribute(k_fused<T, NT>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  done = true;
}

cudaLaunchConfig_t launch_cfg(cudaLaunchAttribute* at, int CL, int NT, int64_t B, size_t smem, cudaStream_t st) {
  cudaLaunchConfig_t cfg = {};
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = unsigned(CL), at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(unsigned(CL), unsigned(B), 1);
  cfg.blockDim = dim3(unsigned(NT), 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  return cfg;
}

// Cluster sizes above 8 are non-portable: ask once per shape whether one can be resident.
template <class T, int NT>
bool cluster_fits(int CL, size_t smem) {
  static int ok_cl[17] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
  if (CL <= 8) return true;
  int& ok = ok_cl[CL];
  if (ok < 0) {
    set_attrs<T, NT>();
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t cfg = launch_cfg(at, CL, NT, 1, smem, nullptr);
    int n = 0;
    const bool q = cudaOccupancyMaxActiveClusters(&n, k_fused<T, NT>, &cfg) == cudaSuccess;
    (void)cudaGetLastError();
    ok = q && n >= 1 ? 1 : 0;
  }
  return ok == 1;
}

// How many clusters of CL CTAs (with smem bytes each) can be resident at once (cached).
template <class T, int NT>
int max_clusters(int CL, size_t smem) {
  struct Ent {
    int CL;
    size_t smem;
    int n;
  };
  static Ent cache[16];
  static int used = 0;
  for (int i = 0; i < used; ++i)
    if (cache[i].CL == CL && cache[i].smem == smem) return cache[i].n;
  set_attrs<T, NT>();
  cudaLaunchAttribute at[1];
  const cudaLaunchConfig_t cfg = launch_cfg(at, CL, NT, 1, smem, nullptr);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, k_fused<T, NT>, &cfg) != cudaSuccess) n = 0;
  (void)cudaGetLastError();
  if (used < 16) cache[used++] = Ent{CL, smem, n};
  return n;
}

template <class T, int NT>
void launch_nt(const SampleArgs& a, Cfg c, cudaStream_t st) {
  FGeo g = geo_for(a.V, c);
  size_t smem = smem_of(g, c, a.B);
  if (!cluster_fits<T, NT>(c.CL, smem)) {
    c.CL = 8;
    g = geo_for(a.V, c);
    smem = smem_of(g, c, a.B);
  }
  // many rows: 8-CTA clusters fill the H200 only up to 30 at once (GPC sizes), so B = 32 would
  // take a second wave; 7-CTA clusters pack 32 rows in one (two CTAs per SM, 43 entries per thread)
  if (c.CL == 8 && a.B > 4 && env_int("GPUKIT_SAMPLING_CLUSTER") == 0) {
    const int n8 = max_clusters<T, NT>(8, smem);
    if (n8 > 0 && a.B > n8) {
      Cfg c7{7, c.NT};
      FGeo g7 = geo_for(a.V, c7);
      const size_t s7 = smem_of(g7, c7, a.B);
      const int n7 = geo_ok(g7, c7) ? max_clusters<T, NT>(7, s7) : 0;
      if (n7 > 0 && (a.B + n7 - 1) / n7 < (a.B + n8 - 1) / n8) c = c7, g = g7, smem = s7;
    }
  }
  g.aligned = (reinterpret_cast<uintptr_t>(a.logits) % 16 == 0) && ((a.row_stride * int64_t(sizeof(T))) % 16 == 0);
  // top-p on linear keys: faster at B <= 4 (checkpoint A of session 5, V = 151936, B = 1: f32
  // 29.5 / 36.6 us peaked / flat against 33.8 / 38.2 on float keys, bf16 33.8 / 37.5 against
  // 39.2 / 41.5) and for bf16 at B = 32 (93.4 / 105.3 against 99.2 / 109.0); f32 at B = 32
  // kept the float keys (flat 107.8 against 111.5). GPUKIT_SAMPLING_QSEL=0 / 1 forces either.
  const char* qe = std::getenv("GPUKIT_SAMPLING_QSEL");
  g.qsel = qe && (qe[0] == '0' || qe[0] == '1') ? qe[0] == '1' : (a.B <= 4 || sizeof(T) == 2);
  set_attrs<T, NT>();
  cudaLaunchAttribute at[1];
  const cudaLaunchConfig_t cfg = launch_cfg(at, c.CL, NT, a.B, smem, st);
  if (env_int("GPUKIT_SAMPLING_DEBUG")) {  // development: the shape and how many clusters fit at once
    static int64_t last = -1;
    const int64_t key = (int64_t(g.cache) << 52) ^ (int64_t(c.CL) << 40) ^ (int64_t(NT) << 30) ^ (a.B << 20) ^ a.V;
    if (key != last) {
      last = key;
      int n = 0;
      (void)cudaOccupancyMaxActiveClusters(&n, k_fused<T, NT>, &cfg);
      (void)cudaGetLastError();
      std::fprintf(stdout,
                   "sampling_fused: B=%lld V=%lld CL=%d NT=%d E=%d cache=%d smem=%zu+%zu max_active_clusters=%d\n",
                   (long long)a.B, (long long)a.V, c.CL, NT, g.E, g.cache, smem, sizeof(Sh<NT>), n);
      std::fflush(stdout);
    }
  }
  // few rows: with programmatic stream serialization (its launch overlaps the previous kernel's
  // tail; B = 1: -0.5 us). Not with many rows: there the early CTAs of the next launch cost
  // (checkpoint A, B = 32, V = 151936: 90.9 / 111.5 us peaked / flat f32 with it, 83.9 / 101.3
  // without; bf16 93.4 / 105.3 against 85.5 / 91.7). Plain where refused; GPUKIT_SAMPLING_PDL=0 / 1
  // forces either.
  const char* pe = std::getenv("GPUKIT_SAMPLING_PDL");
  const bool pdl = pe && (pe[0] == '0' || pe[0] == '1') ? pe[0] == '1' : a.B <= 4;
  if (pdl) {
    cudaLaunchAttribute at2[2] = {at[0], {}};
    at2[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at2[1].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg2 = cfg;
    cfg2.attrs = at2;
    cfg2.numAttrs = 2;
    if (cudaLaunchKernelEx(&cfg2, k_fused<T, NT>, a, g) == cudaSuccess) {
      GK_LAUNCH_CHECK("sampling_fused");
      return;
    }
    (void)cudaGetLastError();  // not sticky: clear it and launch plainly
  }
  GK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, k_fused<T, NT>, a, g));
  GK_LAUNCH_CHECK("sampling_fused");
}

template <class T>
void launch_fused(const SampleArgs& a, cudaStream_t st) {
  const Cfg c = pick_cfg(a.B, a.V);
  if (c.NT == 1024) launch_nt<T, 1024>(a, c, st);
  else launch_nt<T, 512>(a, c, st);
}

}  // namespace

constexpr int64_t kFusedMinRows = 1;

bool fused_sample_ok(const SampleArgs& a) {
  if (a.mode != SampleMode::Draw || a.top_n > 0 || a.B < 1 || a.B > 65535) return false;
  // Every batch size takes the fused path (session 4's probe on the H200 at B = 1: 33.0 / 37.7 us
  // peaked / flat with penalty + top-p against 35.1 / 38.4 us multi-pass; top-k 50: 25.8 vs 25.4);
  // GPUKIT_SAMPLING_FUSED=0 / 1 forces either (comparison, tests).
  if (const char* e = std::getenv("GPUKIT_SAMPLING_FUSED"); e && (e[0] == '0' || e[0] == '1')) {
    if (e[0] == '0') return false;
  } else if (a.B < kFusedMinRows) {
    return false;
  }
  static int major = -1;  // thread-block clusters: compute capability 9.0 or newer
  if (major < 0) {
    int dev = 0, v = 0;
    major = cudaGetDevice(&dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess
                ? v
                : 0;
    (void)cudaGetLastError();
  }
  if (major < 9) return false;
  if (a.typical_p.ptr || (a.typical_p.value > 0.f && a.typical_p.value < 1.f)) return false;
  const Cfg c = pick_cfg(a.B, a.V);
  // the 8-CTA shape (taken when a larger cluster cannot be resident) must fit as well
  return geo_ok(geo_for(a.V, c), c) && geo_ok(geo_for(a.V, Cfg{c.CL < 8 ? c.CL : 8, c.NT}), c);
}

void fused_sample_rows(const SampleArgs& a, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case DType::f32: return launch_fused<float>(a, st);
    case DType::bf16: return launch_fused<bf16>(a, st);
    case DType::f16: return launch_fused<f16>(a, st);
    default: throw TypeError("logits: dtype must be float32, bfloat16 or float16");
  }
}

}  // namespace gk::cuda
