// Session 7: the staged GGUF GEMV of the 32-weight formats (Q8_0, Q4_0, Q4_1) with its weight copies
// in 128-byte-line-aligned windows (quant_gguf_st.cu, its only includer; the knob's V 39).
//
// k_ggst's stages are U units of UB = 272 / 144 / 160 bytes per row, so its copies start at any
// 16-byte offset of a line (quant_gguf_st_probe.cuh says why that may cap the copies at 74-80% of copy
// on the 30 MB shapes). Here each row's ring in shared memory is NR whole units (NCR 16-byte chunks,
// a multiple of UB: no unit wraps), filled from the warp's byte range [c0, c1) of the row in windows
// of one 128-byte line per row (lane l: chunk l % 8 of rows l / 8 + 4 i), chunk s of the range (s = c -
// c0) at ring chunk s mod NCR. A window is issued as soon as every chunk it overwrites (s - NCR) has
// been decoded; unit i waits for the windows up to its last chunk (+ 7: the rows' line phases differ
// by up to 7 chunks) with a wait count chosen at run time. The decode of a unit is k_ggst's (unit32,
// the same OPT bits), the units of a warp in the same order, the warps' split of K and the reduction
// the same: with the same plan (knob fields D, WT, UX), the same bits as k_ggst.
#pragma once
#include "common/gemv_stage.cuh"
#include "quant_gguf_st_units.cuh"

namespace gk::cuda::gguf_st {

using namespace gemv_detail;

// wait until at most n groups of this thread are pending (n clamped to 0..7)
__device__ __forceinline__ void cp_wait_dyn(int64_t n) {
  if (n <= 0) cp_wait<0>();
  else if (n == 1) cp_wait<1>();
  else if (n == 2) cp_wait<2>();
  else if (n == 3) cp_wait<3>();
  else if (n == 4) cp_wait<4>();
  else if (n == 5) cp_wait<5>();
  else if (n == 6) cp_wait<6>();
  else cp_wait<7>();
}

template <int F>
struct AW {
  static constexpr int UB = GS<F>::UB, NUC = UB / 16;
  static constexpr int NR = (768 + UB - 1) / UB;  // units per row ring (816 / 864 / 800 bytes)
  static constexpr int NCR = NR * NUC;
  static constexpr int P = NCR * 16 % 32 == 16 ? NCR * 16 : NCR * 16 + 16;  // row pitch (conflict-free rows g)
  static constexpr int SB = 16 * P;                                        // bytes per warp
  static_assert(UB % 16 == 0 && NCR > NUC + 13, "whole chunks; the windows a unit waits for are issued");
};

// NODEC (the knob's V 40): the copies and waits alone (no decode; wrong results: this schedule's ceiling).
template <class T, int F, int OPT, bool NODEC = false>
__global__ void __launch_bounds__(256, 2) k_ggst_aw(const QGemvArgs p) {
  constexpr bool PI = (OPT & kOptPI) != 0, FOLD = (OPT & kOptFold) != 0;
  constexpr bool B8 = F == int(QFormat::q8_0) && std::is_same_v<T, bf16> && PI;
  using A = AW<F>;
  constexpr int UB = A::UB, UW = GS<F>::UW, NUC = A::NUC, NR = A::NR, NCR = A::NCR, P = A::P;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int64_t nu = p.k / UW;
  const int64_t parts = int64_t(gridDim.y) * nw, pi = int64_t(blockIdx.y) * nw + warp;
  const int64_t u0 = nu * pi / parts, u1 = nu * (pi + 1) / parts;
  const int64_t c0 = u0 * NUC, c1 = u1 * NUC;  // the warp's chunks of a row

  extern __shared__ uint4 smem[];
  const uint32_t ring = smem_addr(smem) + uint32_t(warp) * uint32_t(A::SB);
  const int ch = lane & 7, rr = lane >> 3;
  const uint8_t* rp[4];
  int64_t cs[4];  // window 0's chunk of row rr + 4 i (line-aligned in the address)
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + rr + 4 * i < p.n ? row0 + rr + 4 * i : p.n - 1;
    rp[i] = static_cast<const uint8_t*>(p.q) + row * p.q_rs;
    const int64_t lead = int64_t((reinterpret_cast<uintptr_t>(rp[i]) / 16 + uint64_t(c0)) & 7);
    cs[i] = c0 - (lead < c0 ? lead : c0);
  }
  const int64_t nwin = (c1 - c0 + 14) / 8;  // windows covering [c0, c1) at any line phase
  const uint32_t rdst = ring + uint32_t(rr * P);
  int64_t issued = 0;
  auto issue = [&]() {
    const int64_t w = issued;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t c = cs[i] + 8 * w + ch;
      if (c >= c0 && c < c1)
        cp_async16(rdst + uint32_t(4 * i * P + int((c - c0) % NCR) * 16), rp[i] + 16 * c);
    }
    cp_commit();
    ++issued;
  };

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int xrow = g < p.m ? g : int(p.m) - 1;
  const T* xr = static_cast<const T*>(p.x) + int64_t(xrow) * p.x_rs + 4 * t;
  uint32_t magic = std::is_same_v<T, bf16> ? 0x43434343u : 0x64646464u;
  asm volatile("" : "+r"(magic));
  const uint32_t opq = PI ? uint32_t(p.m) >> 31 : 0u;
  if constexpr (PI) magic |= opq;

  pdl_trigger();
  while (issued < nwin && 8 * issued + 7 < NCR) issue();
  pdl_wait();
  int slot = 0;
  for (int64_t i = 0; i < u1 - u0; ++i) {
    const int64_t wn = std::min<int64_t>((NUC * i + NUC + 6) / 8, nwin - 1);  // the last window unit i needs
    cp_wait_dyn(issued - 1 - wn);
    __syncwarp();  // every lane's copies of the unit are visible
    [[maybe_unused]] const uint32_t a = ring + uint32_t(g * P + slot * UB), b = a + uint32_t(8 * P);
    if constexpr (!NODEC) unit32<T, F, B8, PI, FOLD>(a, b, xr + (u0 + i) * UW, t, magic, acc);
    slot = slot + 1 == NR ? 0 : slot + 1;
    __syncwarp();  // every lane is done with the unit's chunks
    while (issued < nwin && 8 * issued + 7 < NCR + NUC * (i + 1)) issue();
  }
  cp_wait<0>();

  // the warps' sums, added in warp order (as k_ggst)
  const int S = gridDim.y, sl = blockIdx.y;
  float* red = reinterpret_cast<float*>(smem);  // [nw][32][4]
  if (nw > 1) {
    __syncthreads();
#pragma unroll
    for (int e = 0; e < 4; ++e) red[(warp * 32 + lane) * 4 + e] = acc[e];
    __syncthreads();
  }
  if (warp != 0) return;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float v = acc[e];
    if (nw > 1) {
      v = red[lane * 4 + e];
      for (int w = 1; w < nw; ++w) v += red[(w * 32 + lane) * 4 + e];
    }
    const int m = 2 * t + (e & 1);
    const int64_t row = row0 + g + (e >= 2 ? 8 : 0);
    if (m < p.m && row < p.n) {
      if (p.xinv) v *= __ldg(p.xinv + m);
      if (S == 1) store_out(p.y, p.out_dtype, m * p.n + row, v);
      else p.part[(int64_t(sl) * p.m + m) * p.n + row] = v;
    }
  }
}

}  // namespace gk::cuda::gguf_st
