// CUDA attention_decode, the fold kernel's third way to cut the work (common/decode_fold.cuh): CTA
// group units, in one launch, for a few sequences (head_dim 64 and 128).
//
// A unit is one group of kGroup = 8 chunks of one (sequence, kv head, head group), run by one CTA of
// 8 warps: warp w reduces chunk w of the group (tile by tile, as every fold kernel does; a warp
// whose chunk is past the sequence's end runs one masked tile to keep step). At the unit's end each
// warp puts its chunk's partial in the ring stage it has just consumed (free until its next copy),
// and after a barrier the CTA folds the chunks in order through shared memory: the group's result.
// A sequence of one group is written directly; otherwise the result goes to the workspace, and the
// CTA that completes the sequence's count of groups (an integer counter per (sequence, kv head, head
// group), reset by that CTA) folds the groups in order and writes the output. Same partials, same
// folds, same order as attention_decode_fold.cu's chunk and group units and its merge kernel: the
// same bits. All chunks of a group are in flight at once, and there is no second launch: the short
// sequences of small batches run at about one memory round trip plus the launch.
#include <cfloat>

#include "cuda/attention_decode_ll.cuh"
#include "cuda/common/attention.cuh"
#include "cuda/common/decode_fold.cuh"
#include "cuda/common/decode_mma.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

namespace {
using namespace dmma;
using namespace dfold;
using namespace dll;

struct CCursor {
  int item;  // >= nitems: done
  int tile;
  int qi;
  int b, kvh, h0, nh;
  int grp, ng, nw;  // the group, the sequence's groups, the group's chunks
  int len, ntile;   // this warp's chunk: keys (<= 0: none) and tiles (at least 1)
  int64_t j0;
};

// Dense units (pre: the groups of each sequence): unit = (pre[b] + group) * H + kv head * ngb + head group.
__device__ __forceinline__ void find_cunit(const DecodeArgs& a, int ngb, int nitems, int stride, const int* pre,
                                           int warp, CCursor& c) {
  c.tile = 0;
  if (c.item >= nitems) return;
  int r = c.item;
  const int gb = r % ngb;
  r /= ngb;
  const int kvh = r % a.hkv;
  r /= a.hkv;
  int lo = 0, hi = a.B;
  while (hi - lo > 1) {
    const int m = (lo + hi) >> 1;
    if (pre[m] <= r) lo = m;
    else hi = m;
  }
  const int b = lo, u = r - pre[lo];
  const SeqPlan p = seq_plan(a, b);
  const int G = a.hq / a.hkv;
  const int c0 = u * kGroup, cw = c0 + warp;
  c.b = b;
  c.kvh = kvh;
  c.h0 = kvh * G + gb * 8;
  c.nh = min(8, G - gb * 8);
  c.grp = u;
  c.ng = p.ng;
  c.nw = min(kGroup, p.nsp - c0);
  c.j0 = p.start + int64_t(cw) * p.chunk;
  c.len = cw < p.nsp ? int(min(p.chunk, p.n - int64_t(cw) * p.chunk)) : 0;
  c.ntile = max(1, (c.len + 15) / 16);
}

__device__ __forceinline__ int tile_row_c(const DecodeArgs& a, int nitems, const CCursor& c, int lane) {
  const int t = c.tile * 16 + (lane & 15);
  if (c.item >= nitems || t >= c.len) return -1;
  const int j = int(c.j0) + t;
  if (!a.block_table) return c.b * int(a.bs) + j;
  const int bs = int(a.bs), blk = a.block_table[c.b * a.bt_stride + j / bs];
  return blk < 0 || blk >= a.nb ? -1 : blk * bs + j % bs;
}

// 37 (LL): 18 with the cross-CTA merge of attention_decode_ll.cuh (tickets at the start, tagged partials, no
// fence or completion counter; one unit per CTA: the host launches it only where units <= SMs).
template <class T, int D, bool LL>
__device__ __forceinline__ void fold_cta(const DecodeArgs& a, int* counters, int fence1) {
  using Cf = MCfg<D>;
  static_assert(Cf::W == kGroup, "one warp per chunk of a group");
  constexpr int W = Cf::W, S = Cf::S, ROWB = Cf::ROWB, CH = Cf::CH, KVB = Cf::KVB, STAGE = Cf::STAGE,
                CPL = Cf::CPL, QPL = Cf::QPL, KSTEP = Cf::KSTEP;
  static_assert(8 * D * 4 + 64 <= STAGE, "a chunk partial fits in one stage");
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ unsigned msk[W][S];
  __shared__ int pre_s[kMaxDenseF + 1];
  __shared__ int pub[W];  // the stage holding each warp's partial
  __shared__ int last;
  __shared__ unsigned ll_s[2];  // (LL) this CTA's ticket and the launch's tag

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int stride = int(gridDim.x);
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8, H = a.hkv * ngb;
  gdc_wait();  // (launched with PDL: q, the cache and the lengths may come from the previous kernel)
  gdc_launch();  // the next kernel waits for this grid's completion before reading the outputs
  const int nitems = unit_prefix(a, H, 1, pre_s);
  for (int b = blockIdx.x; b < a.B; b += gridDim.x) {  // sequences without keys: 0
    if (seq_plan(a, b).nsp > 0) continue;
    for (int i = threadIdx.x; i < a.hq * D; i += W * 32) static_cast<T*>(a.out)[int64_t(b) * a.hq * D + i] = convert<T>(0.f);
  }
  unsigned char* ring = smem + size_t(warp) * Cf::WARPB;
  unsigned char* qslots = ring + S * STAGE;
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring)), qslots_s = ring_s + S * STAGE;
  const T* kc = static_cast<const T*>(a.kc);
  const T* vc = static_cast<const T*>(a.vc);
  const T* qp = static_cast<const T*>(a.q);

  CCursor P;
  P.item = blockIdx.x;
  P.qi = 0;
  find_cunit(a, ngb, nitems, stride, pre_s, warp, P);
  if (P.item >= nitems) return;  // (the same for every warp of the CTA)
  CCursor C = P;
  int prow = tile_row_c(a, nitems, P, lane);

  auto issue = [&](int ps) {
    if (P.item < nitems) {
      unsigned char* st = ring + ps * STAGE;
      const unsigned m = __ballot_sync(kFull, prow >= 0) & 0xffffu;
      if (lane == 0) msk[warp][ps] = m;
      const int64_t hoff = int64_t(P.kvh) * D;
#pragma unroll
      for (int u = 0; u < CPL; ++u) {
        const int c = lane + 32 * u, r = c / CH, cc = c % CH;
        const int row = __shfl_sync(kFull, prow, r);
        const bool ok = row >= 0;
        const int64_t off = ok ? int64_t(row) * a.hkv * D + hoff + cc * 8 : 0;
        cp_async16(st + swz(r, cc, ROWB), kc + off, ok);
        cp_async16(st + KVB + swz(r, cc, ROWB), vc + off, ok);
      }
      if (P.tile == 0) {
        const T* q = qp + int64_t(P.b) * a.q_bs + int64_t(P.h0) * a.q_hs;
#pragma unroll
        for (int u = 0; u < QPL; ++u) {
          const int c = lane + 32 * u, r = c / CH, cc = c % CH;
          const bool ok = r < P.nh;
          cp_async16(qslots + P.qi * Cf::QB + swz(r, cc, ROWB), ok ? q + int64_t(r) * a.q_hs + cc * 8 : qp, ok);
        }
      }
    }
    cp_async_commit();
  };
  auto advance = [&](CCursor& c) {
    if (c.item >= nitems) return;
    if (++c.tile < c.ntile) return;
    c.item += stride;
    find_cunit(a, ngb, nitems, stride, pre_s, warp, c);
    c.qi = c.qi + 1 == Cf::NQ ? 0 : c.qi + 1;
  };

#pragma unroll 1
  for (int i = 0; i < S - 1; ++i) {
    issue(i);
    advance(P);
    prow = tile_row_c(a, nitems, P, lane);
  }
  unsigned long long* const llc = reinterpret_cast<unsigned long long*>(counters);  // (LL)
  if constexpr (LL) {  // the ticket (one unit per CTA), taken while the first tiles are in flight
    if (threadIdx.x == 0 && C.ng > 1) ll_ticket(llc, (C.b * a.hkv + C.kvh) * ngb + (C.h0 - C.kvh * G) / 8, ll_s);
  }

  const float sl2 = a.scale * kLog2e;
  const bool capped = a.softcap > 0.f;
  const float cap_in = capped ? a.scale / a.softcap : 0.f, cap_out = a.softcap * kLog2e;
  uint32_t qa[KSTEP][2];
  float o[KSTEP][4];
#pragma unroll
  for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[mt][e] = 0.f;
  float mrow = -INFINITY, lsum = 0.f;
  const int hA = 2 * t4, hB = 2 * t4 + 1;

  int cs = 0, ps = S - 1;
#pragma unroll 1
  while (C.item < nitems) {
    cp_async_wait<S - 2>();
    __syncwarp();
    const uint32_t st = ring_s + cs * STAGE;
    if (C.tile == 0) {
#pragma unroll
      for (int k2 = 0; k2 < KSTEP / 2; ++k2) {
        uint32_t x[4];
        ldsm_x4(x, qslots_s + C.qi * Cf::QB + swz(lane & 7, 4 * k2 + (lane >> 3), ROWB));
        qa[2 * k2][0] = x[0];
        qa[2 * k2][1] = x[1];
        qa[2 * k2 + 1][0] = x[2];
        qa[2 * k2 + 1][1] = x[3];
      }
      __syncwarp();
    }
    issue(ps);
    advance(P);
    prow = tile_row_c(a, nitems, P, lane);
    ps = ps + 1 == S ? 0 : ps + 1;
    tile_step<T, D>(st, qa, msk[warp][cs], sl2, capped, cap_in, cap_out, o, mrow, lsum, lane);

    if (C.tile + 1 == C.ntile) {  // this warp's chunk ends: publish its partial, then the CTA folds
      float l = lsum;
      l += __shfl_xor_sync(kFull, l, 1);
      l += __shfl_xor_sync(kFull, l, 2);
      const float mA = __shfl_sync(kFull, mrow, 8 * t4), mB = __shfl_sync(kFull, mrow, 8 * t4 + 4);
      const float lA = __shfl_sync(kFull, l, 8 * t4), lB = __shfl_sync(kFull, l, 8 * t4 + 4);
      float* pw = reinterpret_cast<float*>(ring + cs * STAGE);  // consumed: free until this warp's next copy
      // (the tile's ldmatrix reads of this stage are done by every lane before the shuffles above)
#pragma unroll
      for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e & 1 ? hB : hA, d = mt * 16 + g + (e >= 2 ? 8 : 0);
          pw[h * D + d] = o[mt][e];
        }
      if (lane < 4) {
        pw[8 * D + 2 * hA] = mA;
        pw[8 * D + 2 * hA + 1] = lA;
        pw[8 * D + 2 * hB] = mB;
        pw[8 * D + 2 * hB + 1] = lB;
      }
      if (lane == 0) pub[warp] = cs;
      __syncthreads();
      const int64_t hrow = int64_t(C.b) * a.hq + C.h0;
      for (int idx = threadIdx.x; idx < C.nh * D; idx += W * 32) {
        const int h = idx / D, d = idx - h * D;
        float M = -INFINITY, L = 0.f, O = 0.f;
        for (int w = 0; w < C.nw; ++w) {
          const float* q = reinterpret_cast<const float*>(smem + size_t(w) * Cf::WARPB + pub[w] * STAGE);
          float wa, wb;
          fold_w(M, q[8 * D + 2 * h], wa, wb);
          L = fold_v(L, wa, q[8 * D + 2 * h + 1], wb);
          O = fold_v(O, wa, q[h * D + d], wb);
        }
        if (C.ng == 1) {
          static_cast<T*>(a.out)[(hrow + h) * D + d] = convert<T>(finalize(O, L));
        } else if constexpr (LL) {
          ll_put<D>(llc, (C.b * a.hkv + C.kvh) * ngb + (C.h0 - C.kvh * G) / 8, C.grp, h, d, O, M, L, ll_s[1]);
        } else {
          a.ws_o[((hrow + h) * a.nsplit + C.grp) * D + d] = O;
          if (d == 0) {
            float* ml = a.ws_ml + ((hrow + h) * a.nsplit + C.grp) * 2;
            ml[0] = M;
            ml[1] = L;
          }
        }
      }
      if (LL && C.ng > 1) {
        if constexpr (LL)
          merge_ll<T, D, W * 32>(a, int64_t(C.b) * a.hq + C.h0, C.nh, C.ng,
                                 (C.b * a.hkv + C.kvh) * ngb + (C.h0 - C.kvh * G) / 8, llc, ll_s,
                                 reinterpret_cast<float*>(smem + size_t(pub[0]) * STAGE));
      } else if (C.ng > 1) {  // count this group in; the CTA completing the count folds the groups
        const int ci = (C.b * a.hkv + C.kvh) * ngb + (C.h0 - C.kvh * G) / 8;
        // fence1 (35): the barrier orders the CTA's workspace writes before thread 0's fence and count (fences are
        // cumulative; the pattern of cooperative groups' grid sync), and the last CTA's reads after its fence
        if (!fence1) __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
          if (fence1) __threadfence();
          last = atomicAdd(counters + ci, 1) == C.ng - 1;
          if (fence1 && last) __threadfence();
        }
        __syncthreads();
        if (last) {
          if (!fence1) __threadfence();
          constexpr int KO = 8 * D / (W * 32), NGF = 16;  // outputs per thread (at most), groups of the fast path
          float* sml = reinterpret_cast<float*>(smem + size_t(pub[0]) * STAGE);  // warp 0's stage: read, free
          if (C.ng <= NGF && 2 * C.nh * C.ng * 4 <= STAGE) {
            // every partial output of this thread's outputs loaded first, the maxima and sums through shared
            // memory meanwhile: about one memory round trip (the same folds, in group order)
            float ov[KO][NGF];
#pragma unroll
            for (int k = 0; k < KO; ++k) {
              const int idx = threadIdx.x + k * W * 32, h = idx / D, d = idx - h * D;
              const float* po = a.ws_o + (hrow + h) * a.nsplit * D + d;
#pragma unroll
              for (int s2 = 0; s2 < NGF; ++s2)
                ov[k][s2] = idx < C.nh * D && s2 < C.ng ? __ldcg(po + int64_t(s2) * D) : 0.f;
            }
            for (int i = threadIdx.x; i < C.nh * C.ng; i += W * 32) {
              const int h = i / C.ng, s2 = i - h * C.ng;
              const float2 v = __ldcg(reinterpret_cast<const float2*>(a.ws_ml + ((hrow + h) * a.nsplit + s2) * 2));
              sml[2 * i] = v.x;
              sml[2 * i + 1] = v.y;
            }
            __syncthreads();
#pragma unroll
            for (int k = 0; k < KO; ++k) {
              const int idx = threadIdx.x + k * W * 32, h = idx / D, d = idx - h * D;
              if (idx < C.nh * D) {
                float TM = -INFINITY, TL = 0.f, TO = 0.f;
#pragma unroll
                for (int s2 = 0; s2 < NGF; ++s2) {
                  if (s2 < C.ng) {
                    float wa, wb;
                    fold_w(TM, sml[2 * (h * C.ng + s2)], wa, wb);
                    TL = fold_v(TL, wa, sml[2 * (h * C.ng + s2) + 1], wb);
                    TO = fold_v(TO, wa, ov[k][s2], wb);
                  }
                }
                static_cast<T*>(a.out)[(hrow + h) * D + d] = convert<T>(finalize(TO, TL));
              }
            }
          } else {
          for (int idx = threadIdx.x; idx < C.nh * D; idx += W * 32) {
            const int h = idx / D, d = idx - h * D;
            const float* ml = a.ws_ml + (hrow + h) * a.nsplit * 2;
            const float* po = a.ws_o + (hrow + h) * a.nsplit * D + d;
            float TM = -INFINITY, TL = 0.f, TO = 0.f;
#pragma unroll 8
            for (int s = 0; s < C.ng; ++s) {
              const float2 v = __ldcg(reinterpret_cast<const float2*>(ml + 2 * s));
              const float ov = __ldcg(po + int64_t(s) * D);
              float wa, wb;
              fold_w(TM, v.x, wa, wb);
              TL = fold_v(TL, wa, v.y, wb);
              TO = fold_v(TO, wa, ov, wb);
            }
            static_cast<T*>(a.out)[(hrow + h) * D + d] = convert<T>(finalize(TO, TL));
          }
          }
          if (threadIdx.x == 0) counters[ci] = 0;  // every group has arrived: ready for the next launch
        }
      }
      __syncthreads();  // the published stages are read: free for the next copies
#pragma unroll
      for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][e] = 0.f;
      mrow = -INFINITY;
      lsum = 0.f;
    }
    advance(C);
    cs = cs + 1 == S ? 0 : cs + 1;
  }
  cp_async_wait<0>();
}

template <class T, int D>
__global__ void __launch_bounds__(kGroup * 32, 1)
    k_decode_fold_cta(const __grid_constant__ DecodeArgs a, int* counters, int fence1) {
  fold_cta<T, D, false>(a, counters, fence1);
}
template <class T, int D>
__global__ void __launch_bounds__(kGroup * 32, 1)
    k_decode_fold_cta_ll(const __grid_constant__ DecodeArgs a, int* llbuf) {
  fold_cta<T, D, true>(a, llbuf, 0);
}

// False (nothing launched) while the stream's capture is invalidated (no counters): the caller falls back.
template <class T, int D>
bool launch_cta(const DecodeArgs& a, cudaStream_t st, bool fence1) {
  using Cf = MCfg<D>;
  static_assert(Cf::SMEM + Cf::W * Cf::S * 4 + 4 * (kMaxDenseF + 2 + Cf::W) <= 227 * 1024, "shared memory");
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  const int64_t nunits = int64_t((a.nsplit + kGroup - 1) / kGroup) * a.B * a.hkv * ngb;  // bound
  if (nunits + 1024 > INT32_MAX) throw ValueError("q: too many heads x chunks");
  auto kern = k_decode_fold_cta<T, D>;
  {
    static std::atomic<unsigned long long> done{0};
    int dev = 0;
    GK_CUDA_CHECK(cudaGetDevice(&dev));
    const unsigned long long bit = 1ull << (dev & 63);
    if (dev >= 64 || !(done.load(std::memory_order_relaxed) & bit)) {
      GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cf::SMEM)));
      done.fetch_or(bit, std::memory_order_relaxed);
    }
  }
  int* counters = merge_counters(st, int64_t(a.B) * a.hkv * ngb);
  if (!counters) return false;
  const unsigned grid = unsigned(std::min<int64_t>(sm_count(), nunits));
  launch_maybe_pdl(kern, dim3{grid}, dim3{unsigned(Cf::W * 32)}, Cf::SMEM, st, decode_pdl(), a, counters, int(fence1));
  GK_LAUNCH_CHECK("attention_decode_fold_cta");
  return true;
}
// 37: only where every unit has its own CTA (units <= SMs), at most kLLGroups groups per sequence and kLLCtr
// group indices; false (nothing launched) otherwise.
template <class T, int D>
bool launch_cta_ll(const DecodeArgs& a, cudaStream_t st) {
  using Cf = MCfg<D>;
  static_assert(Cf::SMEM + Cf::W * Cf::S * 4 + 4 * (kMaxDenseF + 4 + Cf::W) <= 227 * 1024, "shared memory");
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  const int64_t pairs = int64_t(a.B) * a.hkv * ngb, ngmax = (int64_t(a.nsplit) + kGroup - 1) / kGroup;
  if (ngmax > kLLGroups || pairs > kLLCtr || pairs * ngmax > sm_count()) return false;
  auto kern = k_decode_fold_cta_ll<T, D>;
  {
    static std::atomic<unsigned long long> done{0};
    int dev = 0;
    GK_CUDA_CHECK(cudaGetDevice(&dev));
    const unsigned long long bit = 1ull << (dev & 63);
    if (dev >= 64 || !(done.load(std::memory_order_relaxed) & bit)) {
      GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cf::SMEM)));
      done.fetch_or(bit, std::memory_order_relaxed);
    }
  }
  unsigned long long* buf = ll_buffer(st, pairs);
  if (!buf) return false;
  launch_maybe_pdl(kern, dim3{unsigned(pairs * ngmax)}, dim3{unsigned(Cf::W * 32)}, Cf::SMEM, st, decode_pdl(), a,
                   reinterpret_cast<int*>(buf));
  GK_LAUNCH_CHECK("attention_decode_fold_cta_ll");
  return true;
}
}  // namespace

bool attention_decode_fold_cta_ll(const DecodeArgs& a, cudaStream_t st) {
  const bool half = a.dtype == DType::bf16 || a.dtype == DType::f16;
  if (!half || a.cache_dtype != a.dtype || (a.D != 64 && a.D != 128)) return false;
  if (!aligned16(a.q) || (a.q_bs * 2) % 16 || (a.q_hs * 2) % 16) return false;
  if (a.B > kMaxDenseF || a.nb * a.bs > int64_t(INT32_MAX)) return false;
  if (a.chunk_min % 16) return false;
  auto go = [&](auto t) {
    using T = decltype(t);
    return a.D == 64 ? launch_cta_ll<T, 64>(a, st) : launch_cta_ll<T, 128>(a, st);
  };
  return a.dtype == DType::bf16 ? go(bf16{}) : go(f16{});
}

bool attention_decode_fold_cta(const DecodeArgs& a, cudaStream_t st, bool fence1) {
  const bool half = a.dtype == DType::bf16 || a.dtype == DType::f16;
  if (!half || a.cache_dtype != a.dtype || (a.D != 64 && a.D != 128)) return false;
  if (!aligned16(a.q) || (a.q_bs * 2) % 16 || (a.q_hs * 2) % 16) return false;
  if (a.B > kMaxDenseF || a.nb * a.bs > int64_t(INT32_MAX)) return false;
  if (a.chunk_min % 16) return false;
  auto go = [&](auto t) {
    using T = decltype(t);
    return a.D == 64 ? launch_cta<T, 64>(a, st, fence1) : launch_cta<T, 128>(a, st, fence1);
  };
  return a.dtype == DType::bf16 ? go(bf16{}) : go(f16{});
}

}  // namespace gk::cuda
