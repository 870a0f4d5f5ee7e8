// The work units of the default tensor-core decode-attention kernel k_decode_fold (attention_decode_fold.cu):
// the per-warp cursor over the units (chunk or group units, dense or sparse order), the cache rows of a tile,
// and the in-kernel top fold of one warp. Split from attention_decode_fold.cu; included only there.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/attention.cuh"
#include "cuda/common/decode_fold.cuh"
#include "cuda/common/decode_mma.cuh"
#include "ops/nn_args.h"

namespace gk::cuda::dfold {

struct FCursor {
  int item;  // >= nitems: done
  int tile;
  int qi;
  int b, kvh, h0, nh;
  int slot;     // workspace slot: the chunk (chunk units) or the group (group units)
  int ng;       // the sequence's groups
  bool single;  // the sequence's only unit: writes the output
  int len, ntile, ctiles;  // keys and tiles of the unit, tiles per chunk
  int64_t j0;
};

// Moves c.item (step `stride`) to the first unit at or after it that has keys, and loads it. Dense
// (pre != null): unit = (pre[b] + u) * H + kv head * ngb + head group; sparse (B > kMaxDenseF):
// (b * nslots + u) * H + ..., jumping to the next sequence past its last unit.
__device__ __forceinline__ void find_unit(const DecodeArgs& a, int ngb, int nitems, int stride, int mode,
                                          const int* pre, int nslots, FCursor& c) {
  c.tile = 0;
  const int H = a.hkv * ngb;
  while (c.item < nitems) {
    int r = c.item;
    const int gb = r % ngb;
    r /= ngb;
    const int kvh = r % a.hkv;
    r /= a.hkv;
    int b, u;
    if (pre) {
      int lo = 0, hi = a.B;
      while (hi - lo > 1) {
        const int m = (lo + hi) >> 1;
        if (pre[m] <= r) lo = m;
        else hi = m;
      }
      b = lo;
      u = r - pre[lo];
    } else {
      b = r / nslots;
      u = r % nslots;
    }
    const SeqPlan p = seq_plan(a, b);
    const int nunits = mode ? p.ng : p.nsp;
    if (u >= nunits) {
      if (pre) {
        c.item += stride;
      } else {
        const int64_t next = (int64_t(b) + 1) * nslots * H;
        const int64_t k = (next - c.item + stride - 1) / stride;
        c.item = int(min(int64_t(nitems), c.item + k * int64_t(stride)));
      }
      continue;
    }
    const int G = a.hq / a.hkv;
    const int c0 = mode ? u * kGroup : u, c1 = mode ? min(c0 + kGroup, p.nsp) : u + 1;
    c.b = b;
    c.kvh = kvh;
    c.h0 = kvh * G + gb * 8;
    c.nh = min(8, G - gb * 8);
    c.slot = u;
    c.ng = p.ng;
    c.single = nunits == 1;
    c.j0 = p.start + int64_t(c0) * p.chunk;
    c.len = int(min(int64_t(c1) * p.chunk, p.n) - int64_t(c0) * p.chunk);
    c.ntile = (c.len + 15) / 16;
    c.ctiles = int(p.chunk / 16);
    return;
  }
}

__device__ __forceinline__ int tile_row_f(const DecodeArgs& a, int nitems, const FCursor& c, int lane) {
  const int t = c.tile * 16 + (lane & 15);
  if (c.item >= nitems || t >= c.len) return -1;
  const int j = int(c.j0) + t;
  if (!a.block_table) return c.b * int(a.bs) + j;
  const int bs = int(a.bs), blk = a.block_table[c.b * a.bt_stride + j / bs];
  return blk < 0 || blk >= a.nb ? -1 : blk * bs + j % bs;
}

// The top fold of one warp (in-kernel merge of group units): the ng group results of heads
// [hrow, hrow + nh) in group order, written as the outputs. Lanes 8 h + i (head h of a pass of 4) own
// dims [i * D / 8, (i + 1) * D / 8); loads issued 8 groups at a time. The same folds as k_merge_fold.
template <class T, int D>
__device__ __forceinline__ void warp_top_fold(const DecodeArgs& a, int64_t hrow, int nh, int ng, int lane) {
  constexpr int DL = D / 8, NV = DL / 4, GB = 8;  // dims per lane, float4 per lane, groups per batch
  for (int h0 = 0; h0 < nh; h0 += 4) {
    const int h = h0 + (lane >> 3), i = lane & 7;
    if (h >= nh) continue;  // (no warp-wide operations below)
    const float* ml = a.ws_ml + (hrow + h) * a.nsplit * 2;
    const float* po = a.ws_o + (hrow + h) * a.nsplit * D + i * DL;
    float TM = -INFINITY, TL = 0.f, TO[DL];
#pragma unroll
    for (int k = 0; k < DL; ++k) TO[k] = 0.f;
    for (int s0 = 0; s0 < ng; s0 += GB) {
      float2 st[GB];
      float4 ov[GB][NV];
#pragma unroll
      for (int j = 0; j < GB; ++j) {
        const bool ok = s0 + j < ng;
        st[j] = ok ? __ldcg(reinterpret_cast<const float2*>(ml + 2 * (s0 + j))) : make_float2(-INFINITY, 0.f);
#pragma unroll
        for (int v = 0; v < NV; ++v)
          ov[j][v] = ok ? __ldcg(reinterpret_cast<const float4*>(po + int64_t(s0 + j) * D) + v)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int j = 0; j < GB; ++j) {
        if (s0 + j < ng) {
          float wa, wb;
          fold_w(TM, st[j].x, wa, wb);
          TL = fold_v(TL, wa, st[j].y, wb);
#pragma unroll
          for (int v = 0; v < NV; ++v) {
            TO[4 * v] = fold_v(TO[4 * v], wa, ov[j][v].x, wb);
            TO[4 * v + 1] = fold_v(TO[4 * v + 1], wa, ov[j][v].y, wb);
            TO[4 * v + 2] = fold_v(TO[4 * v + 2], wa, ov[j][v].z, wb);
            TO[4 * v + 3] = fold_v(TO[4 * v + 3], wa, ov[j][v].w, wb);
          }
        }
      }
    }
    T* out = static_cast<T*>(a.out) + (hrow + h) * D + i * DL;
#pragma unroll
    for (int k = 0; k < DL; ++k) out[k] = convert<T>(finalize(TO[k], TL));
  }
}

}  // namespace gk::cuda::dfold
