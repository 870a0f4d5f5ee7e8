// The kernel of the engine's fused decode attention (src/cuda/llm_attention.cu, the only
// includer, describes it; the launch and the entry points are there): RoPE of q and k, the
// paged KV append and attention over the chunk's keys, the merges of the chunks.
#pragma once
#include <algorithm>
#include <cfloat>
#include <type_traits>

#include "cuda/common/attention.cuh"
#include "cuda/common/rows.cuh"
#include "cuda/llm_attention_parts.cuh"
#include "cuda/llm_attention_push.cuh"
#include "cuda/llm_common.cuh"
#include "llm/fused.h"
#include "ops/nn_args.h"

namespace gk::cuda {
namespace {
using namespace llmk;


// threads per CTA: 128, or one per key for chunks of more than 128 keys
constexpr int at_threads(int kc) { return kc < 128 ? 128 : kc; }
constexpr int kAG = 8;     // at most 8 query heads per kv head
// CTAs per SM the compiler is told to fit (__launch_bounds__): WM > 1 (fused_attention_wide) at
// most 64 registers per thread, so that the CTA holds 16K (WM 2) / 32K (WM 4) of the SM's 64K
// registers: blocks of the next kernel launched early (the o GEMV's k_project_stage2: 256
// threads x 64 registers) keep 3 / 2 slots beside it (WM 1: 128 threads x <= 68 registers, 3).
// WM 1: 0, which nvcc treats as not given (no .minnctapersm: the kernels as before)
constexpr int at_min_blocks(int kc, int wm) { return wm == 1 ? 0 : 65536 / (at_threads(kc) * wm * 64); }

// KC keys per chunk (128: one thread per key in the score pass; 64: two, each half the row)
template <int D, int KC>
struct ACfg {
  static constexpr int KROW = D * 2 + 16;  // padded key row (bytes): conflict-free 16-byte reads
  static constexpr int VROW = D * 2;
  static constexpr size_t K_OFF = 0;
  static constexpr size_t V_OFF = K_OFF + size_t(KC) * KROW;
  static constexpr size_t Q_OFF = V_OFF + size_t(KC) * VROW;
  static constexpr size_t P_OFF = Q_OFF + size_t(kAG) * D * 4;
  static constexpr size_t SMEM = P_OFF + size_t(kAG) * KC * 4;
  // the merge stages every chunk's (max, sum) in the K and V area
  static_assert(size_t(kAG) * ((llm::fused::attention_rope_max_keys + KC - 1) / KC) * 2 * 4 <= size_t(KROW + VROW) * KC,
                "merge staging");
};


// CL: the grid's S chunks of a (sequence, kv head) form one cluster (S <= 8) and merge
// through distributed shared memory (no workspace, counter or global round trips): the
// same arithmetic in the same order as the workspace merge, so the same bits.
// MMA: scores on the tensor cores (mma.m16n8k16: a warp's 32 keys x the G heads, q as the
// B operand, the fp32 sums in the tensor core's order), P V with 16-byte V reads (thread:
// 8 dimensions of every KG2-th key, the KG2 key groups then added in order), the output
// staged in shared memory for the stores and the merges. Other bits than !MMA (within
// rounding of float64 attention), the same bits run to run and between the merges.
// CL: 0 no cluster, 1 the pull merge (cluster_merge), 2 the push merge (MMA only;
// llm_attention_push.cuh: st.async into rank 0 + mbarrier, the same bits as 1).
// ER (AttnArgs::early, EngineOptions::fused_attention_early_rope): the RoPE sin / cos of the
// thread's q pairs and k pair (scaled by mscale) and the new token's cache slot computed
// before the PDL wait (they depend on pos, the block table and the frequencies only, all
// written before the step), so that after the wait only the loads and the rotations remain.
// The same arithmetic on the same inputs: the same bits as !ER.
// WM (AttnArgs::wide, EngineOptions::fused_attention_wide; MMA only): WM times the threads
// (8 or 16 warps for chunks of 64 / 128 keys) over the same work: the score pass's 16-key
// tiles spread over the warps (a key's score is one tensor-core sum, whichever warp), the
// softmax one warp per head as before, P V with the same (column, key group) threads
// repeated WM times, each copy 4 / WM of the 4 heads of a head block (every sum over the
// same keys in the same order), the loops over the output elements with WM times the
// threads (the same arithmetic per element): the same bits as WM = 1, with WM times fewer
// instructions per warp in the score and P V passes and the loads, rotations and merges.
template <class T, int D, int kAC, int CL, bool MMA = false, bool ER = false, int WM = 1>
__global__ void __launch_bounds__(at_threads(kAC) * WM, at_min_blocks(kAC, WM)) k_attn_rope(const __grid_constant__ llm::AttnArgs a,
                                                                    const __grid_constant__ llm::ProjRope rope) {
  using Cf = ACfg<D, kAC>;
  static_assert(WM == 1 || (MMA && (WM == 2 || WM == 4)), "more warps: the MMA passes only, 2 or 4 times");
  constexpr int kAT0 = at_threads(kAC);  // the threads of WM = 1 (they fix the P V key groups)
  constexpr int kAT = kAT0 * WM;
  constexpr int TPK = kAT0 / kAC;  // threads per key in the score pass (!MMA)
  static_assert(TPK == 1 || TPK == 2, "64 keys per chunk, or one thread per key");
  extern __shared__ __align__(16) unsigned char sm[];
  __shared__ int64_t kslot[kAC];  // cache slot of each key of the chunk, -1: masked
  __shared__ float red_m[kAG], red_l[kAG];
  __shared__ int s_last;
  __shared__ unsigned long long s_pbar;  // CL 2: rank 0's mbarrier
  constexpr int CH = D / 8;  // 16-byte chunks per row
  const int tid = threadIdx.x;
  const int s = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int64_t cta = (int64_t(b) * gridDim.y + kvh) * gridDim.x + s;
  a_stamp(a, cta, 0);
  if (!a.l2_late)
    l2_prefetch_part(a.l2, a.l2_bytes, (int64_t(b) * gridDim.y + kvh) * gridDim.x + s,
                     int64_t(gridDim.x) * gridDim.y * gridDim.z);
  const int G = a.hq / a.hkv;
  const int64_t p = a.pos[b];  // written before the step: safe before the wait
  // keys past the grid's S chunks lie past the block table (masked anyway): not attended
  const int64_t len = p < 0 ? 0 : (p + 1 < int64_t(a.S) * kAC ? p + 1 : int64_t(a.S) * kAC);
  const int64_t k0 = int64_t(s) * kAC;
  const int nsplit = int((len + kAC - 1) / kAC);
  if (len == 0) {  // nothing to attend to: zero output (as attention_decode), written after the wait
    pdl_trigger();
    pdl_wait();
    if (s == 0)
      for (int e = tid; e < G * D; e += kAT)
        static_cast<T*>(a.out)[(int64_t(b) * a.hq + int64_t(kvh) * G) * D + e] = convert<T>(0.f);
    return;
  }
  if (CL == 2 && nsplit > 1) {  // push: rank 0's mbarrier, then every thread arrives (waits after P V)
    if (s == 0 && tid == 0) push_init(&s_pbar, push_bytes(nsplit, G, D));
    push_cluster_arrive();
  }
  if (k0 >= len) {  // (an exited CTA counts as triggered)
    if (!CL || nsplit == 1) return;
    pdl_trigger();  // cluster: stays for the merge's barriers, so triggers here
    if (CL == 2) return push_cluster_wait();
    cluster_sync_relaxed();
    cluster_sync_relaxed();
    return;
  }
  const int n = int(len - k0 < kAC ? len - k0 : int64_t(kAC));
  unsigned char* Ks = sm + Cf::K_OFF;
  unsigned char* Vs = sm + Cf::V_OFF;
  float* qs = reinterpret_cast<float*>(sm + Cf::Q_OFF);
  float* ps = reinterpret_cast<float*>(sm + Cf::P_OFF);
  // 1. the cached keys / values of the chunk (positions < p)
  for (int j = tid; j < kAC; j += kAT)  // a key whose page is outside the pool: masked
    kslot[j] = j < n ? a_slot(a, b, k0 + j) : -1;
  __syncthreads();
  const T* kc = static_cast<const T*>(a.kc);
  const T* vc = static_cast<const T*>(a.vc);
  for (int e = tid; e < n * CH; e += kAT) {
    const int j = e / CH, c = e - j * CH;
    if (k0 + j >= p) continue;  // the new token: after the wait
    const int64_t slot = kslot[j];
    const int64_t off = slot >= 0 ? (slot * a.hkv + kvh) * D + c * 8 : 0;
    cp_async16(Ks + size_t(j) * Cf::KROW + c * 16, kc + off, slot >= 0);
    cp_async16(Vs + size_t(j) * Cf::VROW + c * 16, vc + off, slot >= 0);
  }
  cp_async_commit();
  a_stamp(a, cta, 1);
  if (a.trigger == 0) pdl_trigger();  // the output projection may launch and start reading its weights
  constexpr int NQ = (kAG * (D / 2) + kAT - 1) / kAT;  // q pairs per thread, at most
  // ER: the rotations' cos / sin (times mscale) and the new token's slot, before the wait
  constexpr int NE = ER ? NQ : 1;
  float ecs[NE], esn[NE], ekc = 0.f, eks = 0.f;
  int64_t eslot = -1;
  if constexpr (ER) {
#pragma unroll
    for (int i = 0; i < NQ; ++i) {
      ecs[i] = esn[i] = 0.f;
      const int u = tid + i * kAT;
      if (u < G * (D / 2)) {
        const int g = u / (D / 2);
        int i1, i2, j;
        a_pair(a, u - g * (D / 2), i1, i2, j);
        if (j >= 0) {
          float sn, cs;
          sincosf(float(p) * rope.inv_freq[j], &sn, &cs);
          ecs[i] = __fmul_rn(cs, a.mscale);
          esn[i] = __fmul_rn(sn, a.mscale);
        }
      }
    }
    if (p >= k0 && p < k0 + n) {  // has_new
      if (tid < D / 2) {
        int i1, i2, j;
        a_pair(a, tid, i1, i2, j);
        if (j >= 0) {
          float sn, cs;
          sincosf(float(p) * rope.inv_freq[j], &sn, &cs);
          ekc = __fmul_rn(cs, a.mscale);
          eks = __fmul_rn(sn, a.mscale);
        }
      }
      eslot = a_slot(a, b, p);
    }
  }
  pdl_wait();  // the q/k/v projection has finished
  a_stamp(a, cta, 2);
  // 2. q of the G heads (rotated, rounded to T as stored), the new k, v: every load of the
  // projection's output issued first (one round trip), then the rotations
  const T* qkv = static_cast<const T*>(a.qkv) + int64_t(b) * a.qkv_rs;
  static_assert(D <= kAT, "one v element and at most one k pair per thread");
  const int nqp = G * (D / 2);
  T qx1[NQ], qx2[NQ];
#pragma unroll
  for (int i = 0; i < NQ; ++i) {
    const int u = tid + i * kAT;
    if (u < nqp) {
      const int g = u / (D / 2);
      int i1, i2, j;
      a_pair(a, u - g * (D / 2), i1, i2, j);
      const T* src = qkv + (int64_t(kvh) * G + g) * D;
      qx1[i] = src[i1];
      qx2[i] = src[i2];
    }
  }
  const bool has_new = p >= k0 && p < k0 + n;  // this chunk holds the new token
  T kx1 = convert<T>(0.f), kx2 = convert<T>(0.f), vx = convert<T>(0.f);
  if (has_new) {
    if (tid < D / 2) {
      int i1, i2, j;
      a_pair(a, tid, i1, i2, j);
      const T* ksrc = qkv + (int64_t(a.hq) + kvh) * D;
      kx1 = ksrc[i1];
      kx2 = ksrc[i2];
    }
    if (tid < D) vx = qkv[(int64_t(a.hq) + a.hkv + kvh) * D + tid];
  }
#pragma unroll
  for (int i = 0; i < NQ; ++i) {
    const int u = tid + i * kAT;
    if (u < nqp) {
      const int g = u / (D / 2);
      int i1, i2, j;
      a_pair(a, u - g * (D / 2), i1, i2, j);
      float x1 = float(qx1[i]), x2 = float(qx2[i]);
      if (j >= 0) {
        float r1, r2;
        if constexpr (ER) {
          rot(x1, x2, ecs[i], esn[i], r1, r2);
        } else {
          float sn, cs;
          sincosf(float(p) * rope.inv_freq[j], &sn, &cs);
          rot(x1, x2, __fmul_rn(cs, a.mscale), __fmul_rn(sn, a.mscale), r1, r2);
        }
        x1 = float(convert<T>(r1));
        x2 = float(convert<T>(r2));
      }
      qs[g * D + i1] = x1;
      qs[g * D + i2] = x2;
    }
  }
  if (has_new) {
    const int jn = int(p - k0);
    const int64_t slot = ER ? eslot : a_slot(a, b, p);
    if (tid < D / 2) {
      int i1, i2, j;
      a_pair(a, tid, i1, i2, j);
      T k1 = kx1, k2 = kx2;
      if (j >= 0) {
        float r1, r2;
        if constexpr (ER) {
          rot(float(k1), float(k2), ekc, eks, r1, r2);
        } else {
          float sn, cs;
          sincosf(float(p) * rope.inv_freq[j], &sn, &cs);
          rot(float(k1), float(k2), __fmul_rn(cs, a.mscale), __fmul_rn(sn, a.mscale), r1, r2);
        }
        k1 = convert<T>(r1);
        k2 = convert<T>(r2);
      }
      T* krow = reinterpret_cast<T*>(Ks + size_t(jn) * Cf::KROW);
      krow[i1] = k1;
      krow[i2] = k2;
      if (slot >= 0) {
        T* kd = static_cast<T*>(a.kc) + (slot * a.hkv + kvh) * D;
        kd[i1] = k1;
        kd[i2] = k2;
      }
    }
    if (tid < D) {
      reinterpret_cast<T*>(Vs + size_t(jn) * Cf::VROW)[tid] = vx;
      if (slot >= 0) static_cast<T*>(a.vc)[(slot * a.hkv + kvh) * D + tid] = vx;
    }
  }
  if (a.trigger == 1) pdl_trigger();  // the projection's output read: the rest is on chip until the merge
  a_stamp(a, cta, 3);
  cp_async_wait<0>();
  __syncthreads();
  a_stamp(a, cta, 4);
  if (a.l2_late) {  // attn_l2 3 / 4: the L2 prefetch now (the last chunk with keys also issues the keyless chunks' parts)
    const int64_t c0 = (int64_t(b) * gridDim.y + kvh) * gridDim.x;
    for (int s2 = s; s2 < (s == nsplit - 1 ? int(gridDim.x) : s + 1); ++s2)
      l2_prefetch_part(a.l2, a.l2_bytes, c0 + s2, int64_t(gridDim.x) * gridDim.y * gridDim.z);
  }
  // 3a. scores: thread t takes key t / TPK (with TPK = 2 each thread half the row, the
  // halves added: the same sum on both threads); MMA: warp w keys 32 w .. 32 w + 31
  if constexpr (MMA) {
    const int lane = tid & 31, warp = tid >> 5;
    const int hn = lane >> 2, kq = (lane & 3) * 2;  // B: head hn, dimensions kq, kq + 1 (+ 8)
    uint32_t bq[D / 16][2];
#pragma unroll
    for (int s2 = 0; s2 < D / 16; ++s2) {
      // (WM > 1: every lane loads, hn < kAG, so that the loads issue together; the heads >= G
      // then take zeros as without WM)
      if (WM > 1 || hn < G) {
        const float2 x0 = *reinterpret_cast<const float2*>(qs + hn * D + 16 * s2 + kq);
        const float2 x1 = *reinterpret_cast<const float2*>(qs + hn * D + 16 * s2 + 8 + kq);
        bq[s2][0] = a_pack2<T>(x0.x, x0.y);
        bq[s2][1] = a_pack2<T>(x1.x, x1.y);
        if (WM > 1 && hn >= G) bq[s2][0] = bq[s2][1] = 0u;
      } else {
        bq[s2][0] = bq[s2][1] = 0u;
      }
    }
    const uint32_t ks_s = static_cast<uint32_t>(__cvta_generic_to_shared(Ks));
    const int lr = (lane & 7) + ((lane >> 3) & 1) * 8, lc = (lane >> 4) * 16;  // ldmatrix row, byte column
    // WM = 1: warp w keys 32 w .. 32 w + 31 (two tiles); else tile t (keys 16 t ..) on warp t % (kAT / 32)
    constexpr int NMT = WM == 1 ? 2 : (kAC / 16 + kAT / 32 - 1) / (kAT / 32);
#pragma unroll
    for (int mt = 0; mt < NMT; ++mt) {
      const int key0 = WM == 1 ? warp * 32 + mt * 16 : (warp + mt * (kAT / 32)) * 16;
      if (key0 < n) {  // (warp-uniform; rows past n hold stale data: their scores are not stored)
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        const uint32_t ra = ks_s + uint32_t((key0 + lr) * Cf::KROW + lc);
#pragma unroll
        for (int s2 = 0; s2 < D / 16; ++s2) {
          uint32_t af[4];
          a_ldsm_x4(af, ra + uint32_t(s2 * 32));
          a_mma<T>(acc, af, bq[s2][0], bq[s2][1]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = key0 + hn + (e >= 2 ? 8 : 0), g = kq + (e & 1);
          if (g < G && j < n) ps[g * kAC + j] = kslot[j] >= 0 ? acc[e] * a.scale : -INFINITY;
        }
      }
    }
  } else {
    const int j = tid / TPK, part = tid % TPK;
    float acc[kAG];
#pragma unroll
    for (int g = 0; g < kAG; ++g) acc[g] = 0.f;
    if (j < n) {
      const unsigned char* kr = Ks + size_t(j) * Cf::KROW;
#pragma unroll 4
      for (int c = part * (CH / TPK); c < (part + 1) * (CH / TPK); ++c) {
        float kf[8];
        vec16_to_float<T>(kr + c * 16, kf);
#pragma unroll
        for (int g = 0; g < kAG; ++g) {
          if (g < G) {
            const float4 q0 = *reinterpret_cast<const float4*>(qs + g * D + c * 8);
            const float4 q1 = *reinterpret_cast<const float4*>(qs + g * D + c * 8 + 4);
            float d = acc[g];
            d = fmaf(q0.x, kf[0], d);
            d = fmaf(q0.y, kf[1], d);
            d = fmaf(q0.z, kf[2], d);
            d = fmaf(q0.w, kf[3], d);
            d = fmaf(q1.x, kf[4], d);
            d = fmaf(q1.y, kf[5], d);
            d = fmaf(q1.z, kf[6], d);
            d = fmaf(q1.w, kf[7], d);
            acc[g] = d;
          }
        }
      }
    }
    if constexpr (TPK == 2) {
#pragma unroll
      for (int g = 0; g < kAG; ++g) acc[g] += __shfl_xor_sync(0xffffffffu, acc[g], 1);
    }
    if (j < n && part == 0) {
      const bool ok = kslot[j] >= 0;
#pragma unroll
      for (int g = 0; g < kAG; ++g)
        if (g < G) ps[g * kAC + j] = ok ? acc[g] * a.scale : -INFINITY;
    }
  }  // (!MMA)
  __syncthreads();
  // 3b. softmax per head: warp w takes heads w, w + 4
  const int lane = tid & 31, warp = tid >> 5;
  if constexpr (WM > 1) {
    // the same per head, the lane's scores loaded once (at most kAC / 32 per lane) before the
    // max, the exponentials and their sum, in the same key order: the same bits
    constexpr int NJ = kAC / 32;
    for (int g = warp; g < G; g += kAT / 32) {
      float sv[NJ];
#pragma unroll
      for (int i = 0; i < NJ; ++i) sv[i] = lane + 32 * i < n ? ps[g * kAC + lane + 32 * i] : -INFINITY;
      float m = -INFINITY;
#pragma unroll
      for (int i = 0; i < NJ; ++i)
        if (lane + 32 * i < n) m = fmaxf(m, sv[i]);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      float l = 0.f;
#pragma unroll
      for (int i = 0; i < NJ; ++i) {
        if (lane + 32 * i < n) {
          const float e = m == -INFINITY ? 0.f : expf(sv[i] - m);
          ps[g * kAC + lane + 32 * i] = e;
          l += e;
        }
      }
      l = warp_sum(l);
      if (lane == 0) red_m[g] = m, red_l[g] = l;
    }
  } else
  for (int g = warp; g < G; g += kAT / 32) {
    float m = -INFINITY;
    for (int j = lane; j < n; j += 32) m = fmaxf(m, ps[g * kAC + j]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0.f;
    for (int j = lane; j < n; j += 32) {
      const float v = ps[g * kAC + j];
      const float e = m == -INFINITY ? 0.f : expf(v - m);
      ps[g * kAC + j] = e;
      l += e;
    }
    l = warp_sum(l);
    if (lane == 0) red_m[g] = m, red_l[g] = l;
  }
  __syncthreads();
  a_stamp(a, cta, 5);
  if constexpr (MMA) {
    // 3c. o = P V: thread (16-byte column c, key group kg) over keys kg, kg + KG2, ..., 8
    // dimensions x 4 heads at a time; the KG2 partial sums added in key-group order into
    // of[G][D] (the q area: q is not read after the scores)
    // (KG2: as many key groups as the threads give, within the K rows' bytes: the V rows
    // are read again for heads 4..7)
    // (WM > 1: thread tid is thread tid % kAT0 of WM = 1 for heads hs HPT .. hs HPT + HPT - 1
    // of each block of 4, hs = tid / kAT0)
    constexpr int CV = D / 8, KG2A = kAT0 / CV, KG2B = int(size_t(Cf::KROW) * kAC / (16 * D));
    constexpr int KG2 = KG2A < KG2B ? KG2A : KG2B;
    constexpr int HPT = 4 / WM;  // heads of a block of 4 per thread
    static_assert(kAT0 % CV == 0 && KG2 >= 1 && size_t(KG2) * 4 * D * 4 <= size_t(Cf::KROW) * kAC, "P V staging");
    const int tid0 = WM == 1 ? tid : tid % kAT0, hs = WM == 1 ? 0 : tid / kAT0;
    const int c = tid0 % CV, kg = tid0 / CV;
    const bool pv = kg < KG2;
    float* of = qs;
    float* comb = reinterpret_cast<float*>(sm + Cf::K_OFF);  // [KG2][4][D] over the (free) K and V rows
    for (int g0 = 0; g0 < G; g0 += 4) {
      const int gh0 = g0 + hs * HPT;  // this thread's first head
      float o2[HPT][8];
#pragma unroll
      for (int gg = 0; gg < HPT; ++gg)
#pragma unroll
        for (int e = 0; e < 8; ++e) o2[gg][e] = 0.f;
      // (WM > 1: 4 keys' loads issued together, the registers of the other heads' sums being free)
      constexpr int PVU = WM == 1 ? 2 : 4;
#pragma unroll PVU
      for (int j = pv ? kg : n; j < n; j += KG2) {
        float v[8];
        vec16_to_float<T>(Vs + size_t(j) * Cf::VROW + c * 16, v);
#pragma unroll
        for (int gg = 0; gg < HPT; ++gg) {
          // (WM > 1: every head row of the block, without branches, so that the unrolled keys'
          // loads issue together; rows of heads >= G hold stale values whose sums nobody reads)
          if (WM > 1 || gh0 + gg < G) {
            const float pj = ps[(gh0 + gg) * kAC + j];
#pragma unroll
            for (int e = 0; e < 8; ++e) o2[gg][e] = fmaf(pj, v[e], o2[gg][e]);
          }
        }
      }
      __syncthreads();  // the scores' K reads (and the previous head block's sums) done
#pragma unroll
      for (int gg = 0; gg < HPT && pv; ++gg) {
        float4* dst = reinterpret_cast<float4*>(comb + (kg * 4 + hs * HPT + gg) * D + c * 8);
        dst[0] = make_float4(o2[gg][0], o2[gg][1], o2[gg][2], o2[gg][3]);
        dst[1] = make_float4(o2[gg][4], o2[gg][5], o2[gg][6], o2[gg][7]);
      }
      __syncthreads();
      for (int e = tid; e < 4 * D; e += kAT) {
        const int gg = e / D;
        if (g0 + gg < G) {
          float t = comb[e];
          for (int q = 1; q < KG2; ++q) t += comb[q * 4 * D + e];
          of[g0 * D + e] = t;
        }
      }
    }
    __syncthreads();
    a_stamp(a, cta, 6);
    if (a.trigger == 2) pdl_trigger();  // before the output / partials and the merge
    T* out = static_cast<T*>(a.out) + (int64_t(b) * a.hq + int64_t(kvh) * G) * D;
    if constexpr (CL) {
      if (CL == 2 && nsplit > 1) {  // push: chunks s > 0 store into rank 0's shared memory
        const unsigned char* recv = sm + Cf::SMEM;
        push_cluster_wait();  // rank 0's mbarrier is initialised
        if (s > 0) push_send<D, kAG>(of, red_m, red_l, G, s, int(gridDim.x), recv, &s_pbar, tid, kAT);
        else push_wait(&s_pbar), push_merge<T, D, kAG>(of, red_m, red_l, nsplit, int(gridDim.x), G, recv, out, tid, kAT);
        a_stamp(a, cta, 7);
        return;
      }
      if (nsplit > 1) {  // rank 0 (chunk 0) merges the chunks' of[] in chunk order
        cluster_sync_all();
        if (s == 0) cluster_merge<T, D>(of, red_m, red_l, nsplit, G, out, tid, kAT);
        cluster_sync_relaxed();  // the other chunks keep their shared memory until rank 0 has read it
        a_stamp(a, cta, 7);
        return;
      }
    }
    if (nsplit == 1) {
      for (int e = tid; e < G * D; e += kAT) {
        const float l = red_l[e / D];
        out[e] = convert<T>(l > 0.f ? of[e] / l : 0.f);
      }
      a_stamp(a, cta, 7);
      return;
    }
    // 4. partials, then the last CTA merges in chunk order (llm_attention_merge.inc)
    const int64_t pr = (int64_t(b) * a.hkv + kvh) * a.S;
    float* wo = a.ws + (pr + s) * kAG * D;
    float* wml = a.ws + int64_t(a.B) * a.hkv * a.S * kAG * D + (pr + s) * kAG * 2;
    for (int e = tid; e < G * D; e += kAT) wo[e] = of[e];
#include "cuda/llm_attention_merge.inc"
  } else {
  // 3c. o = P V: thread (d, key group kg) over keys kg, kg + KG, ...
  constexpr int KG = kAT / D;  // key groups of the P V pass
  static_assert(kAT % D == 0 && KG >= 1, "D divides the CTA");
  const int d = tid % D, kg = tid / D;
  float o[kAG];
#pragma unroll
  for (int g = 0; g < kAG; ++g) o[g] = 0.f;
#pragma unroll 4
  for (int j = kg; j < n; j += KG) {
    const float v = float(reinterpret_cast<const T*>(Vs + size_t(j) * Cf::VROW)[d]);
#pragma unroll
    for (int g = 0; g < kAG; ++g)
      if (g < G) o[g] = fmaf(ps[g * kAC + j], v, o[g]);
  }
  if constexpr (KG > 1) {  // combine the key groups in order through (now free) shared memory
    __syncthreads();
    float* comb = reinterpret_cast<float*>(Ks);  // [KG][G][D]
#pragma unroll
    for (int g = 0; g < kAG; ++g)
      if (g < G) comb[(kg * kAG + g) * D + d] = o[g];
    __syncthreads();
    if (kg == 0) {
#pragma unroll
      for (int g = 0; g < kAG; ++g)
        if (g < G) {
          float t = comb[g * D + d];
          for (int q = 1; q < KG; ++q) t += comb[(q * kAG + g) * D + d];
          o[g] = t;
        }
    }
  }
  a_stamp(a, cta, 6);
  if (a.trigger == 2) pdl_trigger();  // before the output / partials and the merge
  T* out = static_cast<T*>(a.out) + (int64_t(b) * a.hq + int64_t(kvh) * G) * D;
  // (o[] indexed by compile-time g only: a runtime index would put it in local memory)
  if constexpr (CL) {
    if (nsplit > 1) {  // the partials in shared memory, rank 0 (chunk 0) merges them in chunk order
      __syncthreads();  // the K area (comb) is free
      float* part = reinterpret_cast<float*>(sm + Cf::K_OFF);  // [G][D]
      if (kg == 0) {
#pragma unroll
        for (int g = 0; g < kAG; ++g)
          if (g < G) part[g * D + d] = o[g];
      }
      cluster_sync_all();
      if (s == 0) cluster_merge<T, D>(part, red_m, red_l, nsplit, G, out, tid, kAT);
      cluster_sync_relaxed();  // the other chunks keep their shared memory until rank 0 has read it
      a_stamp(a, cta, 7);
      return;
    }
  }
  if (nsplit == 1) {
    if (kg == 0) {
#pragma unroll
      for (int g = 0; g < kAG; ++g)
        if (g < G) out[g * D + d] = convert<T>(red_l[g] > 0.f ? o[g] / red_l[g] : 0.f);
    }
    a_stamp(a, cta, 7);
    return;
  }
  // 4. partials, then the last CTA merges in chunk order (llm_attention_merge.inc)
  const int64_t pr = (int64_t(b) * a.hkv + kvh) * a.S;  // partial rows of this (sequence, kv head)
  float* wo = a.ws + (pr + s) * kAG * D;
  float* wml = a.ws + int64_t(a.B) * a.hkv * a.S * kAG * D + (pr + s) * kAG * 2;
  if (kg == 0) {
#pragma unroll
    for (int g = 0; g < kAG; ++g)
      if (g < G) wo[g * D + d] = o[g];
  }
#define GK_ATTN_MERGE_UNROLL4
#include "cuda/llm_attention_merge.inc"
#undef GK_ATTN_MERGE_UNROLL4
  }  // (!MMA)
}

}  // namespace
}  // namespace gk::cuda
