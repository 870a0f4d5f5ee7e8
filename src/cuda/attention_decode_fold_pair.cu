// CUDA attention_decode, the fold kernel's fifth way to cut the work (common/decode_fold.cuh): one CTA per
// (sequence, kv head, head group) "pair", for many pairs (head_dim 64 and 128). One launch, no workspace, no
// counters, no fences.
//
// Warp w of the CTA runs groups w and w + 8 of the pair (at most 16 groups: the default chunk constants give
// at most 128 chunks), one after the other in one stream of tiles through its ring: each chunk reduced tile
// by tile (the tile step of every fold kernel) and folded into the group's accumulator in registers at its
// end (the fold kernel's warp group units). At the end each warp puts its groups' results in its ring, and
// after one barrier the CTA folds the groups in order (group s in warp s % 8, stage s / 8) and writes O / L.
// Same partials, same folds, same order as the other fold kernels: the same bits. With several pairs per SM
// the grid runs in waves (one CTA per SM: its ring takes the shared memory).
#include <atomic>
#include <cfloat>

#include "cuda/common/attention.cuh"
#include "cuda/common/decode_fold.cuh"
#include "cuda/common/decode_mma.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

namespace {
using namespace dmma;
using namespace dfold;

// EF: K / V loads tagged L2 evict-first.
template <class T, int D, bool EF>
__global__ void __launch_bounds__(kGroup * 32, 1) k_decode_fold_pair(const __grid_constant__ DecodeArgs a) {
  using Cf = MCfg<D>;
  static_assert(Cf::W == kGroup, "two groups per warp cover 16 groups");
  static_assert(Cf::S >= 2, "the two groups' results in stages 0 and 1");
  constexpr int W = Cf::W, S = Cf::S, ROWB = Cf::ROWB, CH = Cf::CH, KVB = Cf::KVB, STAGE = Cf::STAGE,
                CPL = Cf::CPL, QPL = Cf::QPL, KSTEP = Cf::KSTEP;
  static_assert(8 * D * 4 + 64 <= STAGE, "a group's result fits in one stage");
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ unsigned msk[W][S];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8, H = a.hkv * ngb;
  const int b = int(blockIdx.x / unsigned(H)), rem = int(blockIdx.x % unsigned(H));
  const int kvh = rem / ngb, gb = rem % ngb;
  const int h0 = kvh * G + gb * 8, nh = min(8, G - gb * 8);
  gdc_wait();  // (launched with PDL: q, the cache and the lengths may come from the previous kernel)
  gdc_launch();  // the next kernel waits for this grid's completion before reading the outputs
  const SeqPlan p = seq_plan(a, b);
  const int ng = min(p.ng, 2 * W);  // (always p.ng: the host checks the capacity's bound)

  unsigned char* ring = smem + size_t(warp) * Cf::WARPB;
  unsigned char* qslot = ring + S * STAGE;
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring)), qslot_s = ring_s + S * STAGE;
  const int hA = 2 * t4, hB = 2 * t4 + 1;
  // publishes a group's result (o: [KSTEP][4] fragments, stv: mA, mB, lA, lB) into stage k of this warp's ring
  auto publish = [&](int k, const float (&ov)[KSTEP][4], const float (&stv)[4]) {
    float* pw = reinterpret_cast<float*>(ring + k * STAGE);
#pragma unroll
    for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) pw[(e & 1 ? hB : hA) * D + mt * 16 + g + (e >= 2 ? 8 : 0)] = ov[mt][e];
    if (lane < 4) {
      pw[8 * D + 2 * hA] = stv[0];
      pw[8 * D + 2 * hA + 1] = stv[2];
      pw[8 * D + 2 * hB] = stv[1];
      pw[8 * D + 2 * hB + 1] = stv[3];
    }
  };

  {
    // this warp's groups: k = 0: group warp, k = 1: group warp + 8 (keys [j0k, j0k + lenk), ntk tiles)
    int ntk[2], lenk[2];
    int64_t j0k[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int grp = warp + k * W;
      const int64_t c0 = int64_t(grp) * kGroup;
      lenk[k] = grp < ng ? int(min((c0 + kGroup) * p.chunk, p.n) - c0 * p.chunk) : 0;
      j0k[k] = p.start + c0 * p.chunk;
      ntk[k] = (lenk[k] + 15) / 16;
    }
    const int ntot = ntk[0] + ntk[1];
    const int ctiles = int(p.chunk / 16);  // tiles per chunk (chunk_min % 16 == 0)
    const T* kc = static_cast<const T*>(a.kc);
    const T* vc = static_cast<const T*>(a.vc);
    const uint64_t pol = EF ? l2_evict_first() : 0;
    auto row_of = [&](int i) {
      if (i >= ntot) return -1;
      const bool second = i >= ntk[0];
      const int t = second ? i - ntk[0] : i;
      const int tt = t * 16 + (lane & 15);
      if (tt >= (second ? lenk[1] : lenk[0])) return -1;
      const int j = int(second ? j0k[1] : j0k[0]) + tt;
      if (!a.block_table) return b * int(a.bs) + j;
      const int bs = int(a.bs), blk = a.block_table[b * a.bt_stride + j / bs];
      return blk < 0 || blk >= a.nb ? -1 : blk * bs + j % bs;
    };
    int prow = row_of(0);
    auto issue = [&](int i) {
      if (i < ntot) {
        unsigned char* st = ring + (i % S) * STAGE;
        const unsigned m = __ballot_sync(kFull, prow >= 0) & 0xffffu;
        if (lane == 0) msk[warp][i % S] = m;
        const int64_t hoff = int64_t(kvh) * D;
#pragma unroll
        for (int u = 0; u < CPL; ++u) {
          const int c = lane + 32 * u, rr = c / CH, cc = c % CH;
          const int row = __shfl_sync(kFull, prow, rr);
          const bool ok = row >= 0;
          const int64_t off = ok ? int64_t(row) * a.hkv * D + hoff + cc * 8 : 0;
          if constexpr (EF) {
            cp_async16_ef(st + swz(rr, cc, ROWB), kc + off, ok, pol);
            cp_async16_ef(st + KVB + swz(rr, cc, ROWB), vc + off, ok, pol);
          } else {
            cp_async16(st + swz(rr, cc, ROWB), kc + off, ok);
            cp_async16(st + KVB + swz(rr, cc, ROWB), vc + off, ok);
          }
        }
        if (i == 0) {
          const T* qp = static_cast<const T*>(a.q);
          const T* q = qp + int64_t(b) * a.q_bs + int64_t(h0) * a.q_hs;
#pragma unroll
          for (int u = 0; u < QPL; ++u) {
            const int c = lane + 32 * u, rr = c / CH, cc = c % CH;
            const bool ok = rr < nh;
            cp_async16(qslot + swz(rr, cc, ROWB), ok ? q + int64_t(rr) * a.q_hs + cc * 8 : qp, ok);
          }
        }
      }
      cp_async_commit();
      prow = row_of(i + 1);
    };
#pragma unroll 1
    for (int i = 0; i < S - 1; ++i) issue(i);

    const float sl2 = a.scale * kLog2e;
    const bool capped = a.softcap > 0.f;
    const float cap_in = capped ? a.scale / a.softcap : 0.f, cap_out = a.softcap * kLog2e;
    uint32_t qa[KSTEP][2];
    float o[KSTEP][4], go[KSTEP][4], so[KSTEP][4];  // chunk, group accumulator, first group's result
#pragma unroll
    for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][e] = go[mt][e] = so[mt][e] = 0.f;
    float mrow = -INFINITY, lsum = 0.f;
    float gmA = -INFINITY, gmB = -INFINITY, glA = 0.f, glB = 0.f;  // group accumulator (heads hA, hB)
    float sst[4] = {-INFINITY, -INFINITY, 0.f, 0.f};                 // first group's mA, mB, lA, lB
#pragma unroll 1
    for (int i = 0; i < ntot; ++i) {
      cp_async_wait<S - 2>();
      __syncwarp();
      if (i == 0) {
#pragma unroll
        for (int k2 = 0; k2 < KSTEP / 2; ++k2) {
          uint32_t x[4];
          ldsm_x4(x, qslot_s + swz(lane & 7, 4 * k2 + (lane >> 3), ROWB));
          qa[2 * k2][0] = x[0];
          qa[2 * k2][1] = x[1];
          qa[2 * k2 + 1][0] = x[2];
          qa[2 * k2 + 1][1] = x[3];
        }
      }
      issue(i + S - 1);  // into the stage of tile i - 1 (its reads are ordered by the __syncwarp above)
      tile_step<T, D>(ring_s + (i % S) * STAGE, qa, msk[warp][i % S], sl2, capped, cap_in, cap_out, o, mrow, lsum,
                      lane);
      const bool second = i >= ntk[0];
      const int t = second ? i - ntk[0] : i;
      const bool group_end = t + 1 == (second ? ntk[1] : ntk[0]);
      if (group_end || (t + 1) % ctiles == 0) {  // a chunk ends: the group accumulator (+)= this chunk
        float l = lsum;
        l += __shfl_xor_sync(kFull, l, 1);
        l += __shfl_xor_sync(kFull, l, 2);
        const float mA = __shfl_sync(kFull, mrow, 8 * t4), mB = __shfl_sync(kFull, mrow, 8 * t4 + 4);
        const float lA = __shfl_sync(kFull, l, 8 * t4), lB = __shfl_sync(kFull, l, 8 * t4 + 4);
        float waA, wbA, waB, wbB;
        fold_w(gmA, mA, waA, wbA);
        fold_w(gmB, mB, waB, wbB);
        glA = fold_v(glA, waA, lA, wbA);
        glB = fold_v(glB, waB, lB, wbB);
#pragma unroll
        for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            go[mt][e] = e & 1 ? fold_v(go[mt][e], waB, o[mt][e], wbB) : fold_v(go[mt][e], waA, o[mt][e], wbA);
            o[mt][e] = 0.f;
          }
        mrow = -INFINITY;
        lsum = 0.f;
        if (group_end && !second && ntk[1] > 0) {  // the first group is done, the second follows: keep it
#pragma unroll
          for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              so[mt][e] = go[mt][e];
              go[mt][e] = 0.f;
            }
          sst[0] = gmA;
          sst[1] = gmB;
          sst[2] = glA;
          sst[3] = glB;
          gmA = gmB = -INFINITY;
          glA = glB = 0.f;
        }
      }
    }
    cp_async_wait<0>();
    __syncwarp();  // every lane's ldmatrix reads of the ring are done
    if (ntot > 0) {
      const float gst[4] = {gmA, gmB, glA, glB};
      if (ntk[1] > 0) {
        publish(0, so, sst);
        publish(1, go, gst);
      } else {
        publish(0, go, gst);
      }
    }
  }
  __syncthreads();
  // The top fold: groups 0 .. ng - 1 in order (group s: warp s % 8, stage s / 8), then O / L.
  for (int idx = threadIdx.x; idx < nh * D; idx += W * 32) {
    const int h = idx / D, d = idx - h * D;
    float TM = -INFINITY, TL = 0.f, TO = 0.f;
    for (int s = 0; s < ng; ++s) {
      const float* q = reinterpret_cast<const float*>(smem + size_t(s % W) * Cf::WARPB + (s / W) * STAGE);
      float wa, wb;
      fold_w(TM, q[8 * D + 2 * h], wa, wb);
      TL = fold_v(TL, wa, q[8 * D + 2 * h + 1], wb);
      TO = fold_v(TO, wa, q[h * D + d], wb);
    }
    static_cast<T*>(a.out)[(int64_t(b) * a.hq + h0 + h) * D + d] = convert<T>(finalize(TO, TL));
  }
}

template <class T, int D, bool EF>
bool launch_pair(const DecodeArgs& a, cudaStream_t st, bool pdl) {
  using Cf = MCfg<D>;
  static_assert(Cf::SMEM + Cf::W * Cf::S * 4 <= 227 * 1024, "shared memory");
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  const int64_t pairs = int64_t(a.B) * a.hkv * ngb;
  if (pairs > INT32_MAX) return false;
  auto kern = k_decode_fold_pair<T, D, EF>;
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
  launch_maybe_pdl(kern, dim3{unsigned(pairs)}, dim3{unsigned(Cf::W * 32)}, Cf::SMEM, st, pdl && decode_pdl(), a);
  GK_LAUNCH_CHECK("attention_decode_fold_pair");
  return true;
}
}  // namespace

// pdl false (route bit 32768, auto's 28 in place of two waves of 31's CTAs): a plain launch, see attention_decode.cu.
bool attention_decode_fold_pair(const DecodeArgs& a, cudaStream_t st, bool evict_first, bool pdl) {
  const bool half = a.dtype == DType::bf16 || a.dtype == DType::f16;
  if (!half || a.cache_dtype != a.dtype || (a.D != 64 && a.D != 128)) return false;
  if (!aligned16(a.q) || (a.q_bs * 2) % 16 || (a.q_hs * 2) % 16) return false;
  if (a.B > 65535 || a.nb * a.bs > int64_t(INT32_MAX)) return false;
  if (a.chunk_min % 16) return false;
  if ((a.nsplit + kGroup - 1) / kGroup > 2 * kGroup) return false;  // at most 16 groups (two per warp)
  auto go = [&](auto t) {
    using T = decltype(t);
    if (evict_first) return a.D == 64 ? launch_pair<T, 64, true>(a, st, pdl) : launch_pair<T, 128, true>(a, st, pdl);
    return a.D == 64 ? launch_pair<T, 64, false>(a, st, pdl) : launch_pair<T, 128, false>(a, st, pdl);
  };
  return a.dtype == DType::bf16 ? go(bf16{}) : go(f16{});
}

}  // namespace gk::cuda
