// Session 7 (helper gguf8): Q6_K through the line-aligned window copies of k_ggst_aw2 (quant_gguf_st.cu,
// its only includer; the knob's V 45, its copies alone V 46; the switch GPUKIT_GGUF_AW with "q6_k" listed).
//
// Q6_K's units (two blocks, 420 bytes) are not whole 16-byte chunks, so a ring of whole units would be
// 1680 bytes per row (lcm of 16 and 420: 27 KB per warp; the 30 MB shapes keep 14 warps per SM resident
// with ~15.5 KB each). Here the ring is NCR = 56 chunks (896 bytes per row; 14.6 KB per warp with the
// 1 KB of quad-scale scratch) filled exactly as k_ggst_aw2's DYN (chunk s of the warp's range, which
// starts at the chunk of its first unit, at ring chunk s mod NCR; one commit group per window; unit i
// waits for the windows up to its last chunk only), and the units lie in it at any byte offset: unit i
// at (ph + 420 i) mod 896 (ph: the phase of the warp's first unit, 0 / 4 / 8 / 12). A block (210 bytes)
// that crosses the ring's end is decoded by a copy of the block decode whose every shared address past
// the end is taken back by 896 bytes (q6k_block_aw<..., WRAP = true>); the others by the same code
// without the test. The arithmetic is unit_q6k_ss's (the shipped Q6_K decode: PI, quad-shared scales),
// block 0 of a unit 4-byte aligned and block 1 2 mod 4 as there, the units in the same order and the
// warps' split and sum as k_ggst's: with the default's plan, the same bits as the default (tested).
#pragma once
#include "common/gemv_stage.cuh"
#include "quant_gguf_st_aw2.cuh"
#include "quant_gguf_st_units.cuh"

namespace gk::cuda::gguf_st {

using namespace gemv_detail;

// the most windows issued beyond the last one unit i needs (units of ub bytes in a ring of ncr chunks; over
// the phases and i mod 32)
constexpr int aw6_ahead(int ub, int ncr) {
  int k = 0;
  for (int ph = 0; ph < 16; ph += 4)
    for (int i = 0; i < 32; ++i) {
      const int f = (ph + ub * i) >> 4, last = (ph + ub * (i + 1) - 1) >> 4;
      const int d = ((ncr + f - 8) >> 3) - ((last + 7) >> 3);
      k = d > k ? d : k;
    }
  return k;
}

struct AW6 {
  static constexpr int UB = 420, UW = 512, NCR = 56, RB = 16 * NCR, P = RB + 16, SB = 16 * P;
  static_assert(P % 128 == 16 || P % 128 == 48 || P % 128 == 80 || P % 128 == 112, "conflict-free rows g");
  static constexpr int K1 = aw6_ahead(UB, NCR);
  static_assert(K1 >= 1 && K1 <= 7, "the run-time wait counts");
};

// a shared address of a ring row that ends at e (WRAP: it may lie past the end: taken back by RB)
template <bool WRAP>
__device__ __forceinline__ uint32_t wr6(uint32_t a, uint32_t e) {
  if constexpr (WRAP) return a >= e ? a - uint32_t(AW6::RB) : a;
  else return a;
}
// 4 bytes at a (ODD: a % 4 == 2, two 2-byte loads, each taken back on its own; else 4-byte aligned: one load)
template <bool ODD, bool WRAP>
__device__ __forceinline__ uint32_t ld4w(uint32_t a, uint32_t e) {
  if constexpr (ODD) return __byte_perm(lds_u16(wr6<WRAP>(a, e)), lds_u16(wr6<WRAP>(a + 2, e)), 0x5410u);
  else return lds_u32(wr6<WRAP>(a, e));
}

// One Q6_K block of rows g (at a, ring row end ea) and g + 8 (b, eb): unit_q6k_ss's block bk (ODD = bk == 1)
// with its addresses through wr6; x of the block at xb.
template <class T, bool PI, bool ODD, bool WRAP>
__device__ __forceinline__ void q6k_block_aw(uint32_t a, uint32_t b, uint32_t ea, uint32_t eb, const T* xb, int g, int t,
                                             uint32_t magic, uint32_t scr, float (&acc)[4], uint32_t k4b) {
  {
    const int r = t >> 1, j = t & 1;  // row half; sub-blocks 8j..8j+7 (scale bytes 8j..8j+7)
    const uint32_t ad = r ? b : a, e = r ? eb : ea;
    const float d = f16f(lds_u16(wr6<WRAP>(ad + 208, e)));
    float v[8];
#pragma unroll
    for (int q4 = 0; q4 < 2; ++q4) {
      uint32_t u = ld4w<ODD, WRAP>(ad + uint32_t(192 + 8 * j + 4 * q4), e);
      u ^= 0x80808080u;
      v[4 * q4 + 0] = q6_scale<PI, 0x7440u>(u, d, k4b);
      v[4 * q4 + 1] = q6_scale<PI, 0x7441u>(u, d, k4b);
      v[4 * q4 + 2] = q6_scale<PI, 0x7442u>(u, d, k4b);
      v[4 * q4 + 3] = q6_scale<PI, 0x7443u>(u, d, k4b);
    }
    __syncwarp();  // every lane is done reading the previous block's scales
    sts_f4(scr_chunk(scr, r, g, 2 * j), v[0], v[2], v[4], v[6]);
    sts_f4(scr_chunk(scr, r, g, 2 * j + 1), v[1], v[3], v[5], v[7]);
    __syncwarp();
  }
#pragma unroll
  for (int hq = 0; hq < 4; ++hq) {
    const int h = hq >> 1, q = hq & 1;
    const float4 s0 = lds_f4(scr_chunk(scr, 0, g, 2 * h + q)), s1 = lds_f4(scr_chunk(scr, 1, g, 2 * h + q));
    const float dsa[4] = {s0.x, s0.y, s0.z, s0.w}, dsb[4] = {s1.x, s1.y, s1.z, s1.w};
    uint32_t l0[2], l1[2], lh[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // q6k_codes
      const uint32_t ad = r ? b : a, e = r ? eb : ea;
      const uint32_t ol = uint32_t(64 * h + 16 * q + 4 * t), oh = uint32_t(128 + 32 * h + 16 * q + 4 * t);
      l0[r] = ld4w<ODD, WRAP>(ad + ol, e);
      l1[r] = ld4w<ODD, WRAP>(ad + ol + 32, e);
      lh[r] = ld4w<ODD, WRAP>(ad + oh, e);
    }
#pragma unroll
    for (int sb = 0; sb < 4; ++sb) {
      const int si = 8 * h + 2 * sb + q;
      float cc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      q6k_sub_mma<T, PI>(l0, l1, lh, sb, xb + 16 * si, magic, cc);
      acc[0] = fmaf(dsa[sb], cc[0], acc[0]);
      acc[1] = fmaf(dsa[sb], cc[1], acc[1]);
      acc[2] = fmaf(dsb[sb], cc[2], acc[2]);
      acc[3] = fmaf(dsb[sb], cc[3], acc[3]);
    }
  }
}

// NODEC (V 46): the copies and waits alone (zeros; benchmarking).
template <class T, int OPT, bool NODEC = false>
__global__ void __launch_bounds__(256, 2) k_ggst_aw6(const QGemvArgs p) {
  constexpr bool PI = (OPT & kOptPI) != 0;
  constexpr int UB = AW6::UB, UW = AW6::UW, NCR = AW6::NCR, RB = AW6::RB, P = AW6::P, K1 = AW6::K1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int64_t nu = p.k / UW;
  const int64_t parts = int64_t(gridDim.y) * nw, pi = int64_t(blockIdx.y) * nw + warp;
  const int64_t u0 = nu * pi / parts, u1 = nu * (pi + 1) / parts;
  const int nun = int(u1 - u0);
  const int ph = int((u0 * UB) & 15);               // the first unit's byte in its chunk
  const int nch = (ph + nun * UB + 15) >> 4;        // the warp's chunks of a row (host: within 2^30)

  extern __shared__ uint4 smem[];
  const uint32_t ring = smem_addr(smem) + uint32_t(warp) * uint32_t(AW6::SB);
  const uint32_t scr = smem_addr(smem) + uint32_t(nw) * uint32_t(AW6::SB) + uint32_t(warp) * 1024u;
  const int ch = lane & 7, rr = lane >> 3;
  const uint8_t* base[4];  // chunk 0 of the warp's range of row rr + 4 i (the chunk of its first unit's first byte)
  int s[4];
  uint32_t dst[4], rend[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + rr + 4 * i < p.n ? row0 + rr + 4 * i : p.n - 1;
    base[i] = static_cast<const uint8_t*>(p.q) + row * p.q_rs + ((u0 * UB) & ~int64_t(15));
    const int lead = int((reinterpret_cast<uintptr_t>(base[i]) >> 4) & 7);
    s[i] = ch - lead;
    const uint32_t rb = ring + uint32_t((rr + 4 * i) * P);
    dst[i] = rb + uint32_t(16 * (s[i] < 0 ? s[i] + NCR : s[i]));
    rend[i] = rb + uint32_t(16 * NCR);
  }
  const int nwin = (nch + 14) >> 3;
  int wnext = 0;
  auto issue_to = [&](int wlast) {  // windows wnext..wlast (at most the last), one group each
    const int e = wlast < nwin - 1 ? wlast : nwin - 1;
#pragma unroll 1
    for (; wnext <= e; ++wnext) {
      aw2_window<NCR>(base, s, dst, rend, nch);
      cp_commit();
    }
  };

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int xrow = g < p.m ? g : int(p.m) - 1;
  const T* xr = static_cast<const T*>(p.x) + int64_t(xrow) * p.x_rs + 4 * t + u0 * UW;
  uint32_t magic = std::is_same_v<T, bf16> ? 0x43434343u : 0x64646464u;
  asm volatile("" : "+r"(magic));
  const uint32_t opq = PI ? uint32_t(p.m) >> 31 : 0u;
  if constexpr (PI) magic |= opq;
  [[maybe_unused]] const uint32_t k4b = 0x4B000000u | opq;

  pdl_trigger();
  issue_to((NCR - 8) >> 3);
  pdl_wait();
  const uint32_t ra = ring + uint32_t(g * P), rb8 = ra + uint32_t(8 * P);  // rows g, g + 8 of the ring
  const uint32_t ea = ra + uint32_t(RB), eb = rb8 + uint32_t(RB);
  int o = ph;  // unit i's byte in the ring: (ph + 420 i) mod RB
#pragma unroll 1
  for (int i = 0; i < nun; ++i) {
    {
      const int last = (ph + UB * (i + 1) - 1) >> 4;  // unit i's last chunk
      const int wn = (last + 7) >> 3;
      const int n = wnext - 1 - (wn < nwin - 1 ? wn : nwin - 1);
      if (n >= K1) cp_wait<K1>();
      else if (n == K1 - 1) cp_wait<(K1 > 1 ? K1 - 1 : 0)>();
      else cp_wait<0>();
    }
    __syncwarp();  // every lane's copies of the unit are visible
    if constexpr (!NODEC) {
      const int o1 = o + 210 >= RB ? o + 210 - RB : o + 210;  // block 1
      if (o + 210 > RB) q6k_block_aw<T, PI, false, true>(ra + o, rb8 + o, ea, eb, xr, g, t, magic, scr, acc, k4b);
      else q6k_block_aw<T, PI, false, false>(ra + o, rb8 + o, ea, eb, xr, g, t, magic, scr, acc, k4b);
      if (o1 + 210 > RB) q6k_block_aw<T, PI, true, true>(ra + o1, rb8 + o1, ea, eb, xr + 256, g, t, magic, scr, acc, k4b);
      else q6k_block_aw<T, PI, true, false>(ra + o1, rb8 + o1, ea, eb, xr + 256, g, t, magic, scr, acc, k4b);
    }
    xr += UW;
    __syncwarp();  // every lane is done with the unit's chunks
    issue_to((NCR + ((ph + UB * (i + 1)) >> 4) - 8) >> 3);  // the windows whose ring chunks are free now
    o += UB;
    if (o >= RB) o -= RB;
  }
  cp_wait<0>();

  // the warps' sums, added in warp order (as k_ggst)
  warp_sums_out(p, acc, reinterpret_cast<float*>(smem), warp, lane, nw, g, t, row0);
}

}  // namespace gk::cuda::gguf_st
