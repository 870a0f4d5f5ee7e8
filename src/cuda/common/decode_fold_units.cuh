// The work units of the default tensor-core decode-attention kernel k_decode_fold (attention_decode_fold.cu):
// the per-warp cursor over the units (chunk or group units, dense or sparse order) and the cache rows of a
// tile. Split from attention_decode_fold.cu; included only there.
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
  return cache_row(a, c.b, j);
}

}  // namespace gk::cuda::dfold
