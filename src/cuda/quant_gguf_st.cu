// GEMV over the GGUF block formats Q4_0, Q4_1, Q8_0, Q4_K and Q6_K on the tensor cores,
// read directly from the file's blocks (layouts: ops/gguf_blocks.h), with the access
// pattern of the staged bf16 kernel (gemv_w8.cuh): long contiguous runs of every row per
// stage, each warp copy instruction moving 4 rows x 128 contiguous bytes.
//
// A row of K weights is one contiguous byte range of whole blocks. The kernel cuts it into
// units of whole blocks (Q4_0 / Q4_1 / Q8_0: 8 blocks = 256 weights, 144 / 160 / 272 bytes;
// Q4_K: one block, 144 bytes; Q6_K: two blocks, 420 bytes, 512 weights) and a stage into
// U units (288 / 320 / 272 / 288 / 420 bytes per row). A CTA owns 16 rows (the m16 of
// mma.m16n8k16) and nw warps; warp w sweeps its own contiguous run of units (of its
// split-K slice) through a ring of D stages of 16 rows in shared memory, copied with
// 16-byte cp.async (lane l: chunk l % 8 + 8 i of rows l / 8 + 4 r; D - 1 stages in flight;
// only __syncwarp). Rows start 16-byte aligned (checked), so a stage's bytes are the
// 16-byte chunks from floor(start / 16); Q6_K's 420-byte units start at a phase of
// 0 / 4 / 8 / 12 bytes in their first chunk (the decode adds it; its blocks stay 4- and
// 2-byte aligned as at phase 0). Shared rows are P bytes apart, P = 16 / 48 mod 128, so
// the fragment reads (lane (g, t): 4 bytes at 4t of rows g = 0..7) hit 32 banks.
//
// Decode (lane (g, t) takes rows g and g + 8, one mma k-step = 16 weights of one block or
// sub-block): Q4_0 / Q4_1 / Q8_0 take weights 4t..4t+3 (k-step 0) and 16+4t.. (k-step 1)
// of every block (the 4-bit codes: low / high nibbles of bytes 4t..4t+3; Q8_0: bytes 4t..
// and 16+4t..), x row g at the same k; codes become exact bf16/fp16 pairs by byte permutes
// under a magic exponent and one packed subtraction (Q8_0 with bf16 x: through fp32).
// Per block the fp32 mma sum times d (plus Q4_1's m times the block's sum of x, an mma
// with ones). Q4_K / Q6_K: the decodes of quant_gguf_k.cu (sub-block scales formed once per
// block, exact). x rows g >= M read row M - 1 (their columns are dropped).
//
// Warp sums are added in warp order, split-K slices by the second pass; the plan (warps per CTA,
// split) is a function of (N, K, format) only: the same bits every run, for a row alone or batched.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/gemv_gguf.cuh"
#include "common/gemv_stage.cuh"
#include "core/cuda_util.h"
#include "quant_gguf_st_s6.cuh"
#include "quant_gguf_st_units.cuh"
#include "quant_gguf_st_plan.cuh"
#include "quant_gguf_st_probe.cuh"
#include "quant_gguf_st_aw2.cuh"
#include "quant_gguf_st_aw6.cuh"

namespace gk::cuda {

namespace {

using namespace gemv_detail;
using namespace gguf_st;  // GS, GL, kPhased, the unit decodes (quant_gguf_st_units.cuh)

// PROBE: the copies and waits only, no decode (wrong results: the access pattern's ceiling).
// MINB: CTAs of 256 threads per SM the registers are sized for (2: 128 registers; 3 was removed in
// session 6: 0-14 points slower everywhere). B8: Q8_0 with bf16 x decoded by int8x4_bf16.
// ROLL: the stage and unit loops not unrolled (ring slot and unit offset at run time: one copy of a
// unit's decode instead of D x U; the same arithmetic in the same order: the same bits).
// SS: Q4_K / Q6_K with the scales formed once per quad (unit_q4k_ss / unit_q6k_ss; 1 KB of
// scratch per warp after the rings).
// OPT (session 6): bit 0 (kOptPI) byte permutes with immediate selectors, magic bytes in registers
// (bpm: same bits); bit 1 (kOptFold) Q4_1 / Q4_K with bf16 x: codes as 128 + q, the 128 sum(x) taken
// out with the min term (other bits; quant_gguf_st_units.cuh); bit 2 (kOptLate) each stage's slot
// refilled after its decode, not the previous slot before it: D stages in flight while a warp waits,
// D - 1 while it decodes (the same operations on the same data: the same bits).
template <class T, int F, int D, int UX = 1, bool PROBE = false, int MINB = 2, bool B8 = false, bool ROLL = false,
          bool SS = false, int OPT = 0>
__global__ void __launch_bounds__(256, MINB) k_ggst(const QGemvArgs p) {
  constexpr bool PI = (OPT & kOptPI) != 0, FOLD = (OPT & kOptFold) != 0, LATE = (OPT & kOptLate) != 0;
  constexpr bool LA = (OPT & kOptLA) != 0;
  static_assert(!LATE || !ROLL, "late refill: the unrolled decode loop");
  static_assert(!LA || !kPhased<F>, "line-aligned copy lanes: whole-chunk units");
  using L = GL<F, UX>;
  constexpr int UB = GS<F>::UB, UW = GS<F>::UW, U = L::U, NC = L::NC, P = L::P, NK = (NC + 7) / 8;
  constexpr int SB = 16 * P;  // bytes per stage
  static_assert(kPhased<F> || NC * 16 == U * UB, "whole chunks per stage");
  static_assert(P >= NC * 16 && (P % 128 == 16 || P % 128 == 48 || P % 128 == 80 || P % 128 == 112), "pitch");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int64_t nu = p.k / UW;
  const int64_t parts = int64_t(gridDim.y) * nw, pi = int64_t(blockIdx.y) * nw + warp;
  const int64_t u0 = nu * pi / parts, u1 = nu * (pi + 1) / parts;

  extern __shared__ uint4 smem[];
  const uint32_t ring = smem_addr(smem) + uint32_t(warp) * uint32_t(D * SB);
  const uint32_t scr = smem_addr(smem) + uint32_t(nw) * uint32_t(D * SB) + uint32_t(warp) * 1024u;  // SS only
  // copies: lane l takes chunks l % 8 + 8 k of rows l / 8 + 4 i of each stage
  const int ch = lane & 7, rr = lane >> 3;
  // the lane's chunk of each of its rows: at the next stage's first chunk (whole-chunk units),
  // at the warp's first unit (phased units: the stage's chunk offset added per stage)
  const uint8_t* qp[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + rr + 4 * i < p.n ? row0 + rr + 4 * i : p.n - 1;
    qp[i] = static_cast<const uint8_t*>(p.q) + row * p.q_rs + (LA ? 0 : ch * 16) + (kPhased<F> ? 0 : u0 * UB);
  }
  const uint32_t cdst = ring + uint32_t(rr * P + (LA ? 0 : ch * 16));
  int64_t un = u0;  // the next unit to copy
  auto issue = [&](int st) {
    if (un < u1) {
      const uint32_t d0 = cdst + uint32_t(st * SB);
      if constexpr (LA) {  // kOptLA: the stage's chunks r < need of each row, chunk r by lane (lead + r) % 8
        // (lead: the stage's first chunk within its 128-byte line): copy k of row i is the row's line k of
        // the stage; shared offset 16 r as below (the same layout)
        const int need = un + U <= u1 ? NC : int((u1 - un) * (UB / 16));
        constexpr int NKA = (NC + 14) / 8;  // lines a stage of NC chunks can touch
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int rel = ch - int((reinterpret_cast<uintptr_t>(qp[i]) >> 4) & 7);  // -7..7
          // the lane's chunk of line k of the stage: src + 128 k (read only where 0 <= rel + 8 k < need)
          const uint8_t* src = qp[i] + 16 * rel;
          const uint32_t dst = d0 + uint32_t(4 * i * P + 16 * rel);
#pragma unroll
          for (int k = 0; k < NKA; ++k)
            if (unsigned(rel + 8 * k) < unsigned(need)) cp_async16(dst + uint32_t(128 * k), src + 128 * k);
          qp[i] += U * UB;
        }
      } else if constexpr (!kPhased<F>) {
        if (un + U <= u1) {
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int k = 0; k < NK; ++k)
              if (NC % 8 == 0 || ch + 8 * k < NC) cp_async16(d0 + uint32_t(4 * i * P + 128 * k), qp[i] + 128 * k);
        } else {
          const int need = int((u1 - un) * (UB / 16));
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int k = 0; k < NK; ++k)
              if (ch + 8 * k < need) cp_async16(d0 + uint32_t(4 * i * P + 128 * k), qp[i] + 128 * k);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) qp[i] += U * UB;
      } else {  // U units of UB bytes from phase (un UB) % 16 (U = 1 here: NC chunks always needed)
        static_assert(!kPhased<F> || (U == 1 && NC * 16 == 12 + UB), "phased units: one per stage");
        const int64_t b0 = un * UB, off = b0 & ~int64_t(15);
        const int64_t nun = u1 - un < U ? u1 - un : U;
        const int need = int(((b0 & 15) + nun * UB + 15) >> 4);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int k = 0; k < NK; ++k)
            if ((U == 1 ? ch + 8 * k < NC : ch + 8 * k < need))
              cp_async16(d0 + uint32_t(4 * i * P + 128 * k), qp[i] + off + 128 * k);
      }
    }
    cp_commit();
    un += U;
  };

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int xrow = g < p.m ? g : int(p.m) - 1;
  const T* xr = static_cast<const T*>(p.x) + int64_t(xrow) * p.x_rs + 4 * t;  // + the lane's k offset in a block
  uint32_t magic = std::is_same_v<T, bf16> ? 0x43434343u : 0x64646464u;
  asm volatile("" : "+r"(magic));  // a register: the byte permutes take it as their second source
  // PI: registers ptxas cannot fold into immediates (p.m <= 8: the or adds nothing)
  const uint32_t opq = PI ? uint32_t(p.m) >> 31 : 0u;
  if constexpr (PI) magic |= opq;
  const uint32_t k4b = 0x4B000000u | opq;

  pdl_trigger();
#pragma unroll
  for (int st = 0; st < (LATE ? D : D - 1); ++st) issue(st);
  pdl_wait();

  const int64_t nst = (u1 - u0 + U - 1) / U;
  // stage j in ring slot st (st == j % D)
  auto stage = [&](int64_t j, int st) {
    if constexpr (LATE) {
      cp_wait<D - 1>();
      __syncwarp();  // every lane's copies of this stage are visible
    } else {
      cp_wait<D - 2>();
      __syncwarp();  // every lane's copies of this stage are visible; every lane is done with the previous stage
      issue(st == 0 ? D - 1 : st - 1);
    }
    if constexpr (PROBE) {
      if constexpr (LATE) {
        __syncwarp();
        issue(st);
      }
      return;
    }
    const int64_t ub = u0 + j * U;  // first unit of the stage
    const uint32_t sb = ring + uint32_t(st * SB + g * P) + uint32_t(kPhased<F> ? ((ub * UB) & 15) : 0);
    const T* xs = xr + ub * UW;
    auto unit = [&](int v) {
      const uint32_t a = sb + uint32_t(v * UB), b = a + uint32_t(8 * P);
      const T* xj = xs + v * UW;
      if constexpr (SS && F == int(QFormat::q4_k) && OPT != 0) unit_q4k_ss_s6<T, PI, FOLD>(a, b, xj, g, t, magic, scr, acc, k4b);
      else if constexpr (SS && F == int(QFormat::q4_k)) unit_q4k_ss<T>(a, b, xj, g, t, magic, scr, acc);
      else if constexpr (SS && F == int(QFormat::q6_k)) unit_q6k_ss<T, PI>(a, b, xj, g, t, magic, scr, acc, k4b);
      else if constexpr (F == int(QFormat::q4_k) && OPT != 0) unit_q4k_s6<T, PI, FOLD>(a, b, xj, t, magic, acc, k4b);
      else if constexpr (F == int(QFormat::q4_k)) unit_q4k<T>(a, b, xj, t, magic, acc);
      else if constexpr (F == int(QFormat::q6_k)) unit_q6k<T, PI>(a, b, xj, t, magic, acc, k4b);
      else unit32<T, F, B8, PI, FOLD>(a, b, xj, t, magic, acc);
    };
    if constexpr (ROLL) {
#pragma unroll 1
      for (int v = 0; v < U; ++v)
        if (v == 0 || ub + v < u1) unit(v);
    } else {
#pragma unroll
      for (int v = 0; v < U; ++v)
        if (v == 0 || ub + v < u1) unit(v);
    }
    if constexpr (LATE) {
      __syncwarp();  // every lane is done with this slot
      issue(st);     // stage j + D
    }
  };
  if constexpr (ROLL) {
    int st = 0;
#pragma unroll 1
    for (int64_t j = 0; j < nst; ++j) {
      stage(j, st);
      st = st + 1 == D ? 0 : st + 1;
    }
  } else {
    for (int64_t j0 = 0; j0 < nst; j0 += D) {
#pragma unroll
      for (int st = 0; st < D; ++st) {
        const int64_t j = j0 + st;
        if (j < nst) stage(j, st);
        else if constexpr (!LATE) issue(st == 0 ? D - 1 : st - 1);  // keeps the group count uniform (empty groups)
      }
    }
  }
  cp_wait<0>();

  // the warps' sums, added in warp order (through the ring memory, free now)
  warp_sums_out(p, acc, reinterpret_cast<float*>(smem), warp, lane, nw, g, t, row0);
}

// ---- Q8_0 with bf16 x: an fp16 copy of x scaled by 2^c per row (the codes then decode in
// fp16 with one byte permute and one subtraction per pair instead of going through fp32) ----

// The power of two c that puts a row's largest |x| (bf16 bits mx, sign cleared) in
// [2^14, 2^15); 0 for a zero, inf or NaN maximum; within [-126, 126]. Every bf16 value down
// to 2^-31 of the maximum is then exact in fp16.
__device__ __forceinline__ int x_exponent(uint32_t mx) {
  if (mx == 0 || mx >= 0x7f80u) return 0;
  const int c = 14 - ilogbf(__uint_as_float(mx << 16));
  return c < -126 ? -126 : (c > 126 ? 126 : c);
}
__device__ __forceinline__ uint32_t x_scale_h2(uint32_t u, float sc) {
  __half2 h = __floats2half2_rn(__uint_as_float(u << 16) * sc, __uint_as_float(u & 0xffff0000u) * sc);
  return *reinterpret_cast<uint32_t*>(&h);
}

// x [m, k] bf16 -> xh [m, k] fp16 = x * 2^c_m, xinv[m] = 2^-c_m. One CTA of 512 threads per row;
// k % 8 == 0, 16-byte aligned rows.
__global__ void __launch_bounds__(512) k_gg_xprep(const bf16* __restrict__ x, int64_t x_rs, int64_t k,
                                                  f16* __restrict__ xh, float* __restrict__ xinv) {
  pdl_trigger();
  pdl_wait();
  const int64_t m = blockIdx.x;
  const uint4* xr = reinterpret_cast<const uint4*>(x + m * x_rs);
  uint4* out = reinterpret_cast<uint4*>(xh + m * k);
  const int64_t nv = k / 8;
  uint32_t mx = 0;
  for (int64_t i = threadIdx.x; i < nv; i += 512) {
    const uint4 v = xr[i];
    mx = max(mx, max(max(v.x & 0x7fffu, (v.x >> 16) & 0x7fffu), max(v.y & 0x7fffu, (v.y >> 16) & 0x7fffu)));
    mx = max(mx, max(max(v.z & 0x7fffu, (v.z >> 16) & 0x7fffu), max(v.w & 0x7fffu, (v.w >> 16) & 0x7fffu)));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  __shared__ uint32_t wm[16];
  if ((threadIdx.x & 31) == 0) wm[threadIdx.x >> 5] = mx;
  __syncthreads();
  mx = wm[0];
  for (int i = 1; i < 16; ++i) mx = max(mx, wm[i]);
  const int c = x_exponent(mx);
  const float sc = __uint_as_float(uint32_t(c + 127) << 23);
  if (threadIdx.x == 0) xinv[m] = __uint_as_float(uint32_t(127 - c) << 23);
  for (int64_t i = threadIdx.x; i < nv; i += 512) {
    const uint4 v = xr[i];
    out[i] = make_uint4(x_scale_h2(v.x, sc), x_scale_h2(v.y, sc), x_scale_h2(v.z, sc), x_scale_h2(v.w, sc));
  }
}

// When all CTAs fit on the GPU at once, the shared memory to ask for so that at most ceil(CTAs / 132) of
// them fit on one SM and the block scheduler spreads them evenly (gemv_w8.cu: the H200 filled fewer SMs
// otherwise); spread 2 (the knob's SP 2): room for one CTA more per SM, so that the next kernel's first
// CTAs can become resident (and copy their first stages) while this one's last CTAs run; 0: smem as is.
int spread_smem(int smem, int64_t blocks, int S, int spread) {
  const int64_t per_sm = (blocks * S + kSMs - 1) / kSMs;
  if (spread && per_sm >= 1 && per_sm <= 16) {
    const int64_t fit = per_sm + (spread == 2 ? 1 : 0);
    const int64_t cap = kSmSmem / (fit + 1) - 1024 + 256;  // just too much for fit + 1 CTAs
    if (fit * (cap + 1024) <= kSmSmem && cap > smem) smem = int(std::min<int64_t>(cap, kSmemMax));
  }
  return smem;
}

template <class T, int F, int D, int UX = 1, bool PROBE = false, int MINB = 2, bool B8 = false, bool ROLL = false,
          bool SS = false, int OPT = 0>
void launch_d(const QGemvArgs& p, int nw, cudaStream_t st, int spread = 1) {
  constexpr int SB = 16 * GL<F, UX>::P + (SS ? 1024 / D : 0);  // SS: the scratch counted in the stages
  static_assert(!SS || 1024 % D == 0, "scratch");
  smem_limit<k_ggst<T, F, D, UX, PROBE, MINB, B8, ROLL, SS, OPT>>(kSmemMax);
  const int64_t blocks = (p.n + 15) / 16;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  const int S = std::max(1, p.split);
  int smem = std::max(nw * D * SB, nw * 32 * 4 * 4);
  if (smem > kSmemMax) throw ValueError("gemv: the staged GGUF kernel's shared memory does not fit");
  smem = spread_smem(smem, blocks, S, spread);
  launch_ex(k_ggst<T, F, D, UX, PROBE, MINB, B8, ROLL, SS, OPT>, dim3(unsigned(blocks), unsigned(S)), nw * 32, smem, st, p.variant != 2, p);
  GK_LAUNCH_CHECK("qgemv_gguf_st");
}

// The session-7 probe (knob V 37 / 38: k_ggst_ap, windows of W = 256 / 512 bytes per row): the plan
// and shared-memory request of the format's default-depth k_ggst: only the access pattern differs.
template <class T, int F, int W>
void launch_ap(const QGemvArgs& p, int nw, cudaStream_t st, int spread) {
  constexpr int D0 = GS<F>::D, SBF = 16 * GL<F, 1>::P, SBA = 16 * (W + 16);
  smem_limit<k_ggst_ap<F, W, D0>>(kSmemMax);
  const int64_t blocks = (p.n + 15) / 16;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  const int S = std::max(1, p.split);
  int smem = std::max({nw * D0 * SBF, nw * D0 * SBA, nw * 32 * 4 * 4});
  if (smem > kSmemMax) throw ValueError("gemv: the GGUF probe's shared memory does not fit");
  smem = spread_smem(smem, blocks, S, spread);
  launch_ex(k_ggst_ap<F, W, D0>, dim3(unsigned(blocks), unsigned(S)), nw * 32, smem, st, p.variant != 2, p);
  GK_LAUNCH_CHECK("qgemv_gguf_st_probe");
}

// k_ggst_aw2 (session 7, gguf8: the knob's V 41, its copies alone V 42, the default under GPUKIT_GGUF_AW): the
// plan (nw, split) of the configuration's fields, the OPT bits of the format's shipped configuration, the
// shared-memory request as launch_aw's.
template <class T, int F, int OPT, bool SS, bool NODEC, bool DYN>
void launch_aw2(const QGemvArgs& p, int nw, int ux, cudaStream_t st, int spread) {
  constexpr int D0 = GS<F>::D;
  constexpr int SBW = AW2<F>::SB + (SS ? 1024 : 0);
  const int sbf = ux == 0 ? 16 * GL<F, 0>::P : 16 * GL<F, 1>::P;
  smem_limit<k_ggst_aw2<T, F, OPT, SS, NODEC, DYN>>(kSmemMax);
  const int64_t blocks = (p.n + 15) / 16;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  const int S = std::max(1, p.split);
  int smem = std::max({nw * D0 * sbf, nw * SBW, nw * 32 * 4 * 4});
  if (smem > kSmemMax) throw ValueError("gemv: the aligned GGUF kernel's shared memory does not fit");
  smem = spread_smem(smem, blocks, S, spread);
  launch_ex(k_ggst_aw2<T, F, OPT, SS, NODEC, DYN>, dim3(unsigned(blocks), unsigned(S)), nw * 32, smem, st, p.variant != 2, p);
  GK_LAUNCH_CHECK("qgemv_gguf_st_aw2");
}

// k_ggst_aw6 (Q6_K; the knob's V 45 / 46): as launch_aw2 (the quad-scale scratch after the rings).
template <class T, bool NODEC>
void launch_aw6(const QGemvArgs& p, int nw, cudaStream_t st, int spread) {
  constexpr int F = int(QFormat::q6_k), D0 = GS<F>::D, SBW = AW6::SB + 1024;
  const int sbf = 16 * GL<F, 1>::P + 1024 / D0;  // the default kernel's stage (SS: the scratch counted in it)
  smem_limit<k_ggst_aw6<T, kOptPI, NODEC>>(kSmemMax);
  const int64_t blocks = (p.n + 15) / 16;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  const int S = std::max(1, p.split);
  int smem = std::max({nw * D0 * sbf, nw * SBW, nw * 32 * 4 * 4});
  if (smem > kSmemMax) throw ValueError("gemv: the aligned GGUF kernel's shared memory does not fit");
  smem = spread_smem(smem, blocks, S, spread);
  launch_ex(k_ggst_aw6<T, kOptPI, NODEC>, dim3(unsigned(blocks), unsigned(S)), nw * 32, smem, st, p.variant != 2, p);
  GK_LAUNCH_CHECK("qgemv_gguf_st_aw6");
}

template <class T, int F, bool DYN, int OQ = 0>
void launch_aw2_v(const QGemvArgs& p, const GCfg& c, const GPlan& pl, bool nodec, cudaStream_t st) {
  constexpr bool kFoldable = std::is_same_v<T, bf16> && (F == int(QFormat::q4_1) || F == int(QFormat::q4_k));
  constexpr bool kSS = F == int(QFormat::q4_k);
  if (nodec) return launch_aw2<T, F, kOptPI, kSS, true, DYN>(p, pl.nw, c.ux, st, c.sp);
  if constexpr (kFoldable) {
    if (c.opt & kOptFold) return launch_aw2<T, F, kOptPI | kOptFold | OQ, kSS, false, DYN>(p, pl.nw, c.ux, st, c.sp);
  }
  launch_aw2<T, F, kOptPI | OQ, kSS, false, DYN>(p, pl.nw, c.ux, st, c.sp);
}

// c.probe 41 / 42 (43 / 44: DYN; 45 / 46: DYN and Q6_K too) on Q8_0 / Q4_0 / Q4_1 / Q4_K (the default depth;
// a row's chunks within 2^30): k_ggst_aw2; 45 / 46 on Q6_K: k_ggst_aw6. false: not applicable (Q6_K below
// 45, other depths): the caller runs the shipped math of c through k_ggst.
template <class T, int F>
bool try_aw2(const QGemvArgs& p, const GCfg& c, const GPlan& pl, cudaStream_t st) {
  if constexpr (F == int(QFormat::q6_k)) {
    if ((c.probe != 45 && c.probe != 46) || c.d != GS<F>::D || p.k / 16 >= (int64_t(1) << 30)) return false;
    if (c.probe == 46) launch_aw6<T, true>(p, pl.nw, st, c.sp);
    else launch_aw6<T, false>(p, pl.nw, st, c.sp);
    if (p.split > 1) launch_sum_q(p, st);
    return true;
  } else {
    if (c.probe < 41 || c.probe > 48 || c.d != GS<F>::D || p.k / GS<F>::UW * AW2<F>::NUC >= (int64_t(1) << 30))
      return false;
    if (F == int(QFormat::q4_k) && !c.ss) return false;
    const bool nodec = c.probe == 42 || c.probe == 44 || c.probe == 46;
    if (c.probe == 47) launch_aw2_v<T, F, true, kOptOpq>(p, c, pl, false, st);
    else if (c.probe == 48) launch_aw2_v<T, F, true, kOptOpq | kOptEarly>(p, c, pl, false, st);
    else if (c.probe >= 43) launch_aw2_v<T, F, true>(p, c, pl, nodec, st);
    else launch_aw2_v<T, F, false>(p, c, pl, nodec, st);
    if (p.split > 1) launch_sum_q(p, st);
    return true;
  }
}

// The session-6 kernels (c.opt != 0; the default depth, UX 1 or 0, MINB 2, not rolled).
template <class T, int F, int UX, int LT = 0>
void launch_s6(const QGemvArgs& p, const GCfg& c, const GPlan& pl, cudaStream_t st) {
  constexpr int PI = kOptPI | LT;  // LT: kOptLate or 0
  constexpr int D0 = GS<F>::D;
  constexpr bool kB8 = F == int(QFormat::q8_0) && std::is_same_v<T, bf16>;
  constexpr bool kSS = F == int(QFormat::q4_k) || F == int(QFormat::q6_k);
  // FOLD changes only Q4_1 / Q4_K with bf16 x (elsewhere the PI kernel is the same code)
  constexpr bool kFold = std::is_same_v<T, bf16> && (F == int(QFormat::q4_1) || F == int(QFormat::q4_k));
  const bool fold = kFold && (c.opt & kOptFold);
  if constexpr (kSS) {
    if (c.ss) {
      if constexpr (kFold) {
        if (fold) return launch_d<T, F, D0, UX, false, 2, false, false, true, PI | kOptFold>(p, pl.nw, st, c.sp);
      }
      return launch_d<T, F, D0, UX, false, 2, false, false, true, PI>(p, pl.nw, st, c.sp);
    }
  }
  if constexpr (kFold) {
    if (fold) return launch_d<T, F, D0, UX, false, 2, false, false, false, PI | kOptFold>(p, pl.nw, st, c.sp);
  }
  launch_d<T, F, D0, UX, false, 2, kB8, false, false, PI>(p, pl.nw, st, c.sp);
}

// GPUKIT_GGUF_LA=1 (c.la; session 8, gguf10): the shipped k_ggst configurations of Q4_0 / Q4_1 / Q4_K (and
// Q8_0's, reached with GPUKIT_GGUF_AW=0) with line-aligned copy lanes (kOptLA): the kernels launch_s6 runs for
// them with kOptLA added (the same plan, layout and decode: the same bits). false: not such a configuration
// (the caller runs it without kOptLA).
template <class T, int F>
bool launch_la(const QGemvArgs& p, const GCfg& c, const GPlan& pl, cudaStream_t st) {
  if constexpr (kPhased<F>) {
    return false;
  } else {
    constexpr int D0 = GS<F>::D;
    constexpr bool kFold = std::is_same_v<T, bf16> && (F == int(QFormat::q4_1) || F == int(QFormat::q4_k));
    constexpr int O = kOptPI | kOptLA | (kFold ? kOptFold : 0);
    const bool late = (c.opt & kOptLate) != 0;
    if (c.d != D0 || c.roll || !(c.opt & kOptPI) || (kFold && !(c.opt & kOptFold))) return false;
    if constexpr (F == int(QFormat::q4_k)) {
      if (!c.ss || c.ux != 0 || late) return false;
      launch_d<T, F, D0, 0, false, 2, false, false, true, O>(p, pl.nw, st, c.sp);
    } else if constexpr (F == int(QFormat::q8_0)) {
      if (c.ux != 1 || !late) return false;
      launch_d<T, F, D0, 1, false, 2, std::is_same_v<T, bf16>, false, false, O | kOptLate>(p, pl.nw, st, c.sp);
    } else {  // Q4_0 / Q4_1
      if (late && c.ux == 1) launch_d<T, F, D0, 1, false, 2, false, false, false, O | kOptLate>(p, pl.nw, st, c.sp);
      else if (late) return false;
      else if (c.ux == 0) launch_d<T, F, D0, 0, false, 2, false, false, false, O>(p, pl.nw, st, c.sp);
      else launch_d<T, F, D0, 1, false, 2, false, false, false, O>(p, pl.nw, st, c.sp);
    }
    if (p.split > 1) launch_sum_q(p, st);
    return true;
  }
}

template <class T, int F>
void launch_f(const QGemvArgs& p, cudaStream_t st) {
  const GCfg c = gcfg(p.variant, QFormat(F), p.n, p.k);
  const GPlan pl = gplan(p.n, p.k, QFormat(F), c);
  constexpr int D0 = GS<F>::D;
  constexpr bool kB8 = F == int(QFormat::q8_0) && std::is_same_v<T, bf16>;
  constexpr bool kHalf = GS<F>::U > 1;  // UX 0 is a layout of its own (else the same as UX 1)
  // roll / ss / b8 / the session-6 kernels apply with the default ring depth and UX 1 only
  // (the session-6 kernels also UX 0 with D 2; else the plain kernels)
  const bool dflt = c.ux == 1 && c.d == D0;
  const int sp = c.sp;
  const int probe = (p.variant == 7 || c.probe == 7) ? 7 : ((p.variant == 36 || c.probe == 36) ? 36 : 0);
  if (!probe && try_aw2<T, F>(p, c, pl, st)) return;
  if ((c.probe == 37 || c.probe == 38) && c.d == D0) {  // session 7: line-aligned windows (wrong results)
    if (c.probe == 37) launch_ap<T, F, 256>(p, pl.nw, st, sp);
    else launch_ap<T, F, 512>(p, pl.nw, st, sp);
    if (p.split > 1) launch_sum_q(p, st);
    return;
  }
  if (c.la && !probe && c.probe == 0 && launch_la<T, F>(p, c, pl, st)) return;
  if (probe && c.d == D0) {  // the copies alone (wrong results; benchmarking)
    if constexpr (!kPhased<F>) {
      if (probe == 7 && c.la) {  // GPUKIT_GGUF_LA=p: variant 7 with line-aligned copy lanes
        launch_d<T, F, D0, 1, true, 2, false, false, false, kOptLA>(p, pl.nw, st, sp);
        if (p.split > 1) launch_sum_q(p, st);
        return;
      }
    }
    if (probe == 7) launch_d<T, F, D0, 1, true>(p, pl.nw, st, sp);
    else launch_d<T, F, D0, 1, true, 2, false, false, false, kOptLate>(p, pl.nw, st, sp);
    if (p.split > 1) launch_sum_q(p, st);
    return;
  }
  if (c.opt && !c.roll && c.d == D0 && (c.ux == 1 || c.ux == 0)) {
    if (c.opt & kOptLate) {
      if constexpr (kHalf) {
        if (c.ux == 0) launch_s6<T, F, 0, kOptLate>(p, c, pl, st);
        else launch_s6<T, F, 1, kOptLate>(p, c, pl, st);
      } else {
        launch_s6<T, F, 1, kOptLate>(p, c, pl, st);
      }
    } else if constexpr (kHalf) {
      if (c.ux == 0) launch_s6<T, F, 0>(p, c, pl, st);
      else launch_s6<T, F, 1>(p, c, pl, st);
    } else {
      launch_s6<T, F, 1>(p, c, pl, st);
    }
    if (p.split > 1) launch_sum_q(p, st);
    return;
  }
  if constexpr (kHalf) {
    if (c.ux == 0) {
      if (c.d == 3) launch_d<T, F, 3, 0>(p, pl.nw, st, sp);
      else launch_d<T, F, 2, 0>(p, pl.nw, st, sp);
      if (p.split > 1) launch_sum_q(p, st);
      return;
    }
  }
  const bool b8 = kB8 && p.variant == 13 && dflt, roll = c.roll && dflt;
  constexpr bool kSS = F == int(QFormat::q4_k) || F == int(QFormat::q6_k);
  if constexpr (kSS) {
    if (c.ss && dflt && !roll) {
      launch_d<T, F, D0, 1, false, 2, false, false, true>(p, pl.nw, st, sp);
      if (p.split > 1) launch_sum_q(p, st);
      return;
    }
  }
  if (b8 && roll) launch_d<T, F, D0, 1, false, 2, kB8, true>(p, pl.nw, st, sp);
  else if (b8) launch_d<T, F, D0, 1, false, 2, kB8>(p, pl.nw, st, sp);
  else if (roll) launch_d<T, F, D0, 1, false, 2, false, true>(p, pl.nw, st, sp);
  else if (c.d == 2) launch_d<T, F, 2>(p, pl.nw, st, sp);
  else if (c.d == 4) launch_d<T, F, 4>(p, pl.nw, st, sp);
  else launch_d<T, F, 3>(p, pl.nw, st, sp);
  if (p.split > 1) launch_sum_q(p, st);
}

}  // namespace

bool gguf_st_shape(int64_t k, QFormat f) {
  switch (f) {
    case QFormat::q4_0:
    case QFormat::q4_1:
    case QFormat::q8_0:
    case QFormat::q4_k: return k > 0 && k % 256 == 0;
    case QFormat::q6_k: return k > 0 && k % 2048 == 0;  // rows of 16-byte multiples (8 blocks = 1680 bytes)
    default: return false;
  }
}

bool gguf_st_applies(const QGemvArgs& p) {
  if (!gguf_st_shape(p.k, p.fmt)) return false;
  return reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && p.q_rs % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && p.x_rs % 8 == 0;
}

int gguf_st_split(int64_t n, int64_t k, QFormat f) { return gplan(n, k, f, gcfg(0, f, n, k)).split; }

// Q8_0 with bf16 x through the fp16 copy of x (variant 12; the workspaces xh, xinv given).
bool q8_xprep(const QGemvArgs& p) {
  return p.fmt == QFormat::q8_0 && p.x_dtype == DType::bf16 && p.xh && p.xinv && p.variant == 12;
}

template <class T>
void launch_gguf_st(const QGemvArgs& pa, cudaStream_t st) {
  QGemvArgs p = pa;
  p.xinv = nullptr;  // the kernel scales its sums by xinv only after k_gg_xprep
  if constexpr (std::is_same_v<T, bf16>) {
    if (q8_xprep(pa)) {
      if (pa.m > int64_t(INT32_MAX)) throw ValueError("gemv: m is too large");
      launch_ex(k_gg_xprep, dim3(unsigned(pa.m)), 512, 0, st, pa.variant != 2, static_cast<const bf16*>(pa.x), pa.x_rs,
                pa.k, static_cast<f16*>(pa.xh), pa.xinv);
      GK_LAUNCH_CHECK("qgemv_gguf_xprep");
      p.x = pa.xh;
      p.x_rs = pa.k;
      p.x_dtype = DType::f16;
      p.xinv = pa.xinv;
      return launch_f<f16, int(QFormat::q8_0)>(p, st);
    }
  }
  switch (p.fmt) {
    case QFormat::q4_0: return launch_f<T, int(QFormat::q4_0)>(p, st);
    case QFormat::q4_1: return launch_f<T, int(QFormat::q4_1)>(p, st);
    case QFormat::q8_0: return launch_f<T, int(QFormat::q8_0)>(p, st);
    case QFormat::q4_k: return launch_f<T, int(QFormat::q4_k)>(p, st);
    case QFormat::q6_k: return launch_f<T, int(QFormat::q6_k)>(p, st);
    default: throw ValueError("gemv: not a GGUF format of the staged kernel");
  }
}
template void launch_gguf_st<bf16>(const QGemvArgs&, cudaStream_t);
template void launch_gguf_st<f16>(const QGemvArgs&, cudaStream_t);

}  // namespace gk::cuda
