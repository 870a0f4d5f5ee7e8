// Session 7 probe of the staged GGUF GEMV (quant_gguf_st.cu, its only includer): the copies alone
// with the int4 staged kernel's access pattern (common/gemv_w4.cuh) on the GGUF kernel's plan.
//
// Why: the GGUF copies alone (variants 7 / 36) stop at 74-80% of copy on (4096, 14336) and (14336,
// 4096) where the int4 kernel's copies reach 85-93% with the same lane mapping (lane l: 16-byte chunks
// l % 8 + 8 k of rows l / 8 + 4 i) and a ring of 2. The difference in the pattern: the int4 kernel
// splits K between warps by whole stages of 256 bytes per row, so every stage's 8-lane row segment is
// one 128-byte line; the GGUF kernel splits K by units (u0 = nu pi / parts) and its stages are U units
// of 272 (Q8_0), 288 (Q4_0), 320 (Q4_1), 288 (Q4_K) or 420 (Q6_K) bytes per row, so the segments
// start at any 16-byte offset of a line: each 8-lane segment touches 2 lines and 5 sectors instead of
// 1 and 4, and a stage's last line is shared with the next stage (fetched twice from L2).
//
// k_ggst_ap: each warp's byte range of its 16 rows (the same units u0..u1 as k_ggst, i.e. the same
// plan: warps per CTA, split-K, shared memory request) copied in windows of W bytes per row aligned
// to 128-byte lines of the address (the first window starts at the line of the warp's first byte;
// chunks outside the range are not copied). Ring of D, each slot refilled after its wait (as variant
// 36's late refill). No decode: the outputs are zeros (benchmarking only; the knob's V 37 / 38).
#pragma once
#include "common/gemv_stage.cuh"
#include "quant_gguf_st_units.cuh"

namespace gk::cuda::gguf_st {

using namespace gemv_detail;

template <int F, int W, int D>
__global__ void __launch_bounds__(256, 2) k_ggst_ap(const QGemvArgs p) {
  static_assert(W % 128 == 0 && W <= 1024, "window: whole lines");
  constexpr int UB = GS<F>::UB, UW = GS<F>::UW, NK = W / 128, PW = W + 16, SB = 16 * PW;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int64_t nu = p.k / UW;
  const int64_t parts = int64_t(gridDim.y) * nw, pi = int64_t(blockIdx.y) * nw + warp;
  const int64_t u0 = nu * pi / parts, u1 = nu * (pi + 1) / parts;
  // the warp's 16-byte chunks of a row: [c0, c1) (rows are whole chunks: gguf_st_applies)
  const int64_t c0 = u0 * UB / 16, c1 = (u1 * UB + 15) / 16;

  extern __shared__ uint4 smem[];
  const uint32_t ring = smem_addr(smem) + uint32_t(warp) * uint32_t(D * SB);
  const int ch = lane & 7, rr = lane >> 3;
  const uint8_t* rp[4];
  int64_t cs[4];  // the first window's first chunk of row rr + 4 i (line-aligned in the address)
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + rr + 4 * i < p.n ? row0 + rr + 4 * i : p.n - 1;
    rp[i] = static_cast<const uint8_t*>(p.q) + row * p.q_rs;
    const int64_t lead = int64_t((reinterpret_cast<uintptr_t>(rp[i]) / 16 + uint64_t(c0)) & 7);
    cs[i] = c0 - (lead < c0 ? lead : c0);
  }
  const int64_t nst = (c1 - c0 + 7 + W / 16 - 1) / (W / 16);
  const uint32_t cdst = ring + uint32_t(rr * PW + ch * 16);
  int64_t jn = 0;  // the next window to copy
  auto issue = [&](int st) {
    if (jn < nst) {
      const uint32_t d0 = cdst + uint32_t(st * SB);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int k = 0; k < NK; ++k) {
          const int64_t c = cs[i] + jn * (W / 16) + ch + 8 * k;
          if (c >= c0 && c < c1) cp_async16(d0 + uint32_t(4 * i * PW + 128 * k), rp[i] + 16 * c);
        }
    }
    cp_commit();
    ++jn;
  };
  pdl_trigger();
#pragma unroll
  for (int st = 0; st < D; ++st) issue(st);
  pdl_wait();
  for (int64_t j0 = 0; j0 < nst; j0 += D) {
#pragma unroll
    for (int st = 0; st < D; ++st) {
      if (j0 + st < nst) {
        cp_wait<D - 1>();
        __syncwarp();
        issue(st);
      }
    }
  }
  cp_wait<0>();
  // zeros (no decode), where k_ggst's warp 0 writes its sums
  if (warp != 0) return;
  const int g = lane >> 2, t = lane & 3, S = gridDim.y, sl = blockIdx.y;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int m = 2 * t + (e & 1);
    const int64_t row = row0 + g + (e >= 2 ? 8 : 0);
    if (m < p.m && row < p.n) {
      if (S == 1) store_out(p.y, p.out_dtype, m * p.n + row, 0.0f);
      else p.part[(int64_t(sl) * p.m + m) * p.n + row] = 0.0f;
    }
  }
}

}  // namespace gk::cuda::gguf_st
