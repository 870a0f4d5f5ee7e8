// The work items of the tensor-core decode-attention kernel k_decode_mma (attention_decode_mma.cu): the
// per-warp cursor over the items, their enumeration (sparse or dense order, CTA mode) and the cache rows of a
// tile. Split from attention_decode_mma.cu; included only there.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/attention.cuh"
#include "cuda/common/decode_mma.cuh"
#include "ops/nn_args.h"

namespace gk::cuda::dmma {

// One work item and the position of a warp's producer or consumer in it.
struct Cursor {
  int item;  // >= nitems: no more items
  int tile;
  int qi;    // the item's query slot
  int b, kvh, h0, nh, split, nsp, len, ntile;
  int64_t j0;
};

// Moves c.item (step `stride`) to the first item at or after it that has keys, and loads it.
// Item order: with kBMajor (the default) sequence-major, the kv heads of one chunk consecutive, so the
// items running at one time cover few sequences (measured a few % faster at large batches than the
// split-major order ((split * B + b) * Hkv + kv head) * ngb + head group, variants 6-7).
// Dense enumeration (pre != null: sequence-major, B <= kMaxDense): pre[b] = the chunks of sequences < b
// (shared memory), item = (pre[b] + split) * Hkv * ngb + kv head * ngb + head group: every item has keys,
// so the round-robin share of the warps is balanced whatever the lengths (the sparse order below spaces
// each sequence's items by the workspace stride nsplit, the most chunks any length up to the capacity can
// have: with 16 of 64 slots used, a quarter of the warps got two shares and a third none).
// Sparse b-major order: ((b * nsplit + split) * Hkv + kv head) * ngb + head group; a warp reaching a
// sequence's unused split slots jumps to its first item of the next sequence.
constexpr int kTPartials = 1, kBMajor = 2, kGrouped = 4;  // flags of k_decode_mma
constexpr int kMaxDense = 512;

// In CTA mode (wsub >= 0: the warp's index among nw) the warps of a CTA share each item: warp w takes
// keys [w * sc, (w + 1) * sc) of the chunk, sc = the chunk / nw rounded up to whole tiles (a function of the
// chunk alone), and at least one tile (fully masked when its range is empty) so that it joins the combine.
__device__ __forceinline__ void find_item(const DecodeArgs& a, int ngb, int nitems, int stride, int flags,
                                          const int* pre, Cursor& c, int wsub = -1, int nw = 1) {
  c.tile = 0;
  const int H = a.hkv * ngb;
  while (c.item < nitems) {
    int b, split, kvh, gb;
    {
      int r = c.item;
      gb = r % ngb;
      r /= ngb;
      kvh = r % a.hkv;
      r /= a.hkv;
      if (pre) {  // r: the global chunk index; b: the largest with pre[b] <= r (pre[B] > r)
        int lo = 0, hi = a.B;
        while (hi - lo > 1) {
          const int m = (lo + hi) >> 1;
          if (pre[m] <= r) lo = m;
          else hi = m;
        }
        b = lo;
        split = r - pre[lo];
      } else if (flags & kBMajor) {
        b = r / a.nsplit;
        split = r % a.nsplit;
      } else {
        b = r % a.B;
        split = r / a.B;
      }
    }
    int64_t L, start;
    decode_span(a, b, L, start);
    const int64_t n = L - start;
    const int64_t chunk = n > 0 ? decode_chunk(n, a.chunk_min, a.chunk_max, a.target_splits) : 1;
    const int64_t nsp = n > 0 ? (n + chunk - 1) / chunk : 0;
    if (split >= nsp) {
      if (!pre && (flags & kBMajor)) {  // jump to this warp's first item of sequence b + 1
        const int64_t next = (int64_t(b) + 1) * a.nsplit * H;
        const int64_t k = next > c.item ? (next - c.item + stride - 1) / stride : 1;
        c.item = int(min(int64_t(nitems), c.item + k * int64_t(stride)));
      } else {
        c.item += stride;
      }
      continue;
    }
    const int G = a.hq / a.hkv;
    c.b = b;
    c.kvh = kvh;
    c.split = split;
    c.nsp = int(nsp);
    c.h0 = kvh * G + gb * 8;
    c.nh = min(8, G - gb * 8);
    c.j0 = start + int64_t(split) * chunk;
    c.len = int(min(chunk, L - c.j0));
    c.ntile = (c.len + 15) / 16;
    if (wsub >= 0) {
      const int sc = int((chunk + 16 * nw - 1) / (16 * nw)) * 16;
      c.j0 += int64_t(wsub) * sc;
      c.len = max(0, min(sc, c.len - wsub * sc));
      c.ntile = max(1, (c.len + 15) / 16);
    }
    return;
  }
}

// Dense enumeration: pre[0..B] (exclusive prefix of the chunk counts) in shared memory, by all threads;
// returns the item count. Ends with a barrier.
__device__ __forceinline__ int dense_prefix(const DecodeArgs& a, int H, int* pre) {
  for (int b = threadIdx.x; b < a.B; b += blockDim.x) {
    int64_t L, start;
    decode_span(a, b, L, start);
    pre[b + 1] = int(decode_nsplit(L - start, a.chunk_min, a.chunk_max, a.target_splits));
  }
  __syncthreads();
  if (threadIdx.x < 32) {  // warp 0: lane l sums entries [l * per, (l + 1) * per), then a shuffle scan
    const int lane = threadIdx.x, per = (a.B + 31) / 32;
    int s = 0;
    for (int j = 0; j < per; ++j) {
      const int i = lane * per + j;
      if (i < a.B) s += pre[i + 1];
    }
    int x = s;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(kFull, x, o);
      if (lane >= o) x += y;
    }
    int run = x - s;
    for (int j = 0; j < per; ++j) {
      const int i = lane * per + j;
      if (i < a.B) {
        run += pre[i + 1];
        pre[i + 1] = run;
      }
    }
    if (lane == 0) pre[0] = 0;
  }
  __syncthreads();
  return pre[a.B] * H;
}

__device__ __forceinline__ void advance(const DecodeArgs& a, int ngb, int nitems, int stride, int flags,
                                        const int* pre, Cursor& c, int wsub, int nw, int nq) {
  if (c.item >= nitems) return;
  if (++c.tile < c.ntile) return;
  c.item += stride;
  find_item(a, ngb, nitems, stride, flags, pre, c, wsub, nw);
  c.qi = c.qi + 1 == nq ? 0 : c.qi + 1;
}

// Cache row of key (lane & 15) of the cursor's tile; -1 past the chunk or for a block outside the pool.
__device__ __forceinline__ int tile_row(const DecodeArgs& a, int nitems, const Cursor& c, int lane) {
  const int t = c.tile * 16 + (lane & 15);
  if (c.item >= nitems || t >= c.len) return -1;
  const int j = int(c.j0) + t;  // key positions fit in 32 bits (lengths are int32); as decode_row
  if (!a.block_table) return c.b * int(a.bs) + j;
  const int bs = int(a.bs), blk = a.block_table[c.b * a.bt_stride + j / bs];
  return blk < 0 || blk >= a.nb ? -1 : blk * bs + j % bs;
}

}  // namespace gk::cuda::dmma
