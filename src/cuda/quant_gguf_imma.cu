// GGUF Q4_0, Q4_1 and Q8_0 decode GEMV with bf16 x at M <= 8 on the INTEGER tensor cores (session 17; NEW
// NUMERICS: x as 16-bit fixed point per 128-element block, as the int4 g128 default, common/gemv_w4i.cuh).
//
// Why: the staged GGUF kernel (quant_gguf_st.cu) turns the codes into bf16 pairs for mma.m16n8k16 with byte
// permutes and packed subtractions; session 8 found its decode's instructions, not its copies, holding the 4-bit
// formats at 51-59 % of copy. Here a block's codes feed mma.sync.m16n8k32 directly: the 16 code bytes of a Q4_0 /
// Q4_1 block hold weights j (low nibble) and j + 16 (high nibble), so lane (g, t)'s 4 bytes at 4t of row g's block
// give its A registers (row g, k 4t..4t+3) = u & 0x0f0f0f0f and (row g, k 16+4t..) = (u >> 4) & 0x0f0f0f0f; Q8_0's
// bytes 4t.. and 16+4t.. are its A registers as they are (s8). One mma k-step is one block.
//
// x: each 128-element block of an x row becomes X = round(x 2^(141 - e)) (e: the biased exponent of the block's
// largest |x|, clamped to 15..254; |X| < 2^15), exactly as k_w4i: elements within 2^7 of the block's largest are
// exact, the others rounded to a multiple of 2^(e - 141). X = 256 h + l (h s8, l u8): sum q X = 256 sum q h +
// sum q l, two mma per block, exact in int32. Per 32-weight block (d, m: the block's fp16 scale and min; S: the
// block's sum of X; f = 2^(e - 141)):
//   Q4_0: acc += float(sum q X - 8 S) * (d f)        Q8_0: acc += float(sum q X) * (d f)
//   Q4_1: acc += (float(sum q X) * d + float(S) * m) * f
// A 128-element block holding inf or NaN gives NaN in every output of its x row.
//
// Plan and copies as k_w4i: a CTA owns 16 rows and nw warps; a warp sweeps its run of stages of 16 blocks (512
// weights: 288 / 320 / 544 bytes per row, 16-byte cp.async, lane l: chunks l % 8 + 8 k of rows l / 8 + 4 i) through
// a ring of D stages; at M = 1 the stage's x (1 KB of bf16) comes with it and the warp converts it in place (lane l:
// blocks l / 4 and 8 + l / 4, t = l % 4); at M > 1 k_ggi_xprep converts x once per call into a workspace with the
// same function, and the GEMV reads column m of the mma as x row m from there: a row gives the same bits alone or in
// a batch. Integer sums are exact and every float operation has a fixed order: the same bits every run.
// Requires K % 512 == 0, 16-byte aligned rows of q and x (gguf_st_applies); the switch GPUKIT_GGUF_IMMA picks it.
#include <cstdlib>
#include <string>

#include "common/gemv_gguf.cuh"
#include "common/gemv_stage.cuh"
#include "common/gemv_w4_ops.cuh"
#include "common/imma.cuh"
#include "core/cuda_util.h"
#include "ops/gguf_blocks.h"

namespace gk::cuda {

namespace {

using namespace gemv_detail;

// BB: bytes per block; QOFF: the codes' offset in the block
template <int F>
struct GI;
template <>
struct GI<int(QFormat::q4_0)> {
  static constexpr int BB = gguf::kQ4_0Bytes, QOFF = 2;
  static constexpr bool kQ8 = false, kMin = false;
};
template <>
struct GI<int(QFormat::q4_1)> {
  static constexpr int BB = gguf::kQ4_1Bytes, QOFF = 4;
  static constexpr bool kQ8 = false, kMin = true;
};
template <>
struct GI<int(QFormat::q8_0)> {
  static constexpr int BB = gguf::kQ8_0Bytes, QOFF = 2;
  static constexpr bool kQ8 = true, kMin = false;
};

// A stage: 16 blocks of 16 rows, rows P bytes apart (P % 32 == 16: rows g = 0..7 start in 8 distinct 16-byte bank
// groups), then (M = 1) x (1 KB: bf16 as copied, then the planes in place: slot 4 b + t = (h of elements 4t..4t+3,
// h of 16+4t..16+4t+3, l of 4t.., l of 16+4t..) of block b) and per block (f32 2^(e - 141) or NaN, s32 sum of X).
template <int F>
struct GIL {
  static constexpr int RB = 16 * GI<F>::BB, NC = RB / 16;
  static constexpr int P = RB % 32 == 16 ? RB : RB + 16;
  static constexpr int W = 16 * P, XOFF = W, MOFF = W + 1024, STG = MOFF + 128;
  static_assert(RB % 16 == 0 && W % 16 == 0, "whole chunks");
};

constexpr uint32_t kXMagicBits = 0x4B400000u;  // 1.5 2^23

// 4 bf16 (u.x: elements 0, 1; u.y: 2, 3) times f (2^(141 - e)) as X: the h bytes, the l bytes, their bits summed
__device__ __forceinline__ void gi_four(uint2 u, float f, uint32_t& hi, uint32_t& lo, uint32_t& sum) {
  constexpr float kMagic = 12582912.0f;  // 1.5 2^23: the bits of x f + kMagic are kXMagicBits + X
  const uint32_t b0 = __float_as_uint(fmaf(__uint_as_float(u.x << 16), f, kMagic));
  const uint32_t b1 = __float_as_uint(fmaf(__uint_as_float(u.x & 0xffff0000u), f, kMagic));
  const uint32_t b2 = __float_as_uint(fmaf(__uint_as_float(u.y << 16), f, kMagic));
  const uint32_t b3 = __float_as_uint(fmaf(__uint_as_float(u.y & 0xffff0000u), f, kMagic));
  sum += b0 + b1 + b2 + b3;
  const uint32_t e01 = __byte_perm(b0, b1, 0x5140u), e23 = __byte_perm(b2, b3, 0x5140u);  // (l0 l1 h0 h1), (l2 l3 h2 h3)
  hi = __byte_perm(e01, e23, 0x7632u);
  lo = __byte_perm(e01, e23, 0x5410u);
}

// One stage (512 elements) of one x row, all 32 lanes: lane l holds block bA = l / 4 (a0: elements 4t..4t+3, a1:
// 16+4t..) and block bA + 8 (c0, c1), t = l % 4. Returns its slots (s0: slot l, s1: slot 32 + l) and per block the
// fixed point's step 2^(e - 141) (NaN where the 128-block holds inf / NaN) and the block's sum of X (the same in
// the block's 4 lanes). The GEMV at M = 1 and k_ggi_xprep both call this: the same X.
struct GiConv {
  uint4 s0, s1;
  float i0, i1;
  int32_t sx0, sx1;
};
__device__ __forceinline__ GiConv gi_convert(uint2 a0, uint2 a1, uint2 c0, uint2 c1) {
  uint32_t mA = w4i_umax2(w4i_umax2(a0.x & 0x7fff7fffu, a0.y & 0x7fff7fffu), w4i_umax2(a1.x & 0x7fff7fffu, a1.y & 0x7fff7fffu));
  uint32_t mC = w4i_umax2(w4i_umax2(c0.x & 0x7fff7fffu, c0.y & 0x7fff7fffu), w4i_umax2(c1.x & 0x7fff7fffu, c1.y & 0x7fff7fffu));
  uint32_t pk = w4i_umax2(__byte_perm(mA, mC, 0x5410u), __byte_perm(mA, mC, 0x7632u));  // (max A, max C)
#pragma unroll
  for (int off = 1; off < 16; off <<= 1) pk = w4i_umax2(pk, __shfl_xor_sync(0xffffffffu, pk, off));  // 128-blocks
  const int e0 = int(pk >> 7) & 0xff, e1 = int(pk >> 23);
  const int q0 = min(max(e0, 15), 254), q1 = min(max(e1, 15), 254);
  const float f0 = __uint_as_float(uint32_t(268 - q0) << 23), f1 = __uint_as_float(uint32_t(268 - q1) << 23);
  GiConv o;
  uint32_t h0, h1, l0, l1, sA = 0, sC = 0;
  gi_four(a0, f0, h0, l0, sA);
  gi_four(a1, f0, h1, l1, sA);
  o.s0 = make_uint4(h0, h1, l0, l1);
  gi_four(c0, f1, h0, l0, sC);
  gi_four(c1, f1, h1, l1, sC);
  o.s1 = make_uint4(h0, h1, l0, l1);
  o.sx0 = int32_t(sA - 8u * kXMagicBits);
  o.sx1 = int32_t(sC - 8u * kXMagicBits);
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {  // the block's 4 lanes
    o.sx0 += __shfl_xor_sync(0xffffffffu, o.sx0, off);
    o.sx1 += __shfl_xor_sync(0xffffffffu, o.sx1, off);
  }
  o.i0 = e0 == 255 ? __uint_as_float(0x7fc00000u) : __uint_as_float(uint32_t(q0 - 14) << 23);
  o.i1 = e1 == 255 ? __uint_as_float(0x7fc00000u) : __uint_as_float(uint32_t(q1 - 14) << 23);
  return o;
}

// M > 1: x [M, K] bf16 -> p.w4x: per 32-weight block a record of 576 bytes: the planes of x rows 0..7 (64 bytes each,
// slots t = 0..3), then (f32 step, s32 sum of X) of rows 0..7; rows M..7 repeat row M - 1 (the GEMV's lanes of
// columns past M read them). So a lane's x (row g) is one 16-byte load and its two columns' steps and sums (rows 2 t,
// 2 t + 1) another, and a block's x for the whole warp is 576 contiguous bytes. Grid (K / 512, M), one warp each; the
// GEMV launched after it (PDL) reads them after its wait.
constexpr int kRec = 576;
__global__ void __launch_bounds__(32) k_ggi_xprep(const QGemvArgs p) {
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x, t = lane & 3, bA = lane >> 2;
  const int64_t st = blockIdx.x, r = blockIdx.y;
  const bf16* xr = static_cast<const bf16*>(p.x) + r * p.x_rs + st * 512;
  const auto ld = [&](int e) { return __ldg(reinterpret_cast<const uint2*>(xr + e)); };
  const GiConv o = gi_convert(ld(32 * bA + 4 * t), ld(32 * bA + 16 + 4 * t), ld(32 * (bA + 8) + 4 * t),
                              ld(32 * (bA + 8) + 16 + 4 * t));
  uint8_t* rec = static_cast<uint8_t*>(p.w4x) + (st * 16 + bA) * kRec;  // block bA's record (bA + 8: 8 records on)
  const int64_t r1 = r + 1 == p.m ? 8 : r + 1;  // the rows this warp writes: r (the last row: M - 1 .. 7)
  for (int64_t rw = r; rw < r1; ++rw) {
    reinterpret_cast<uint4*>(rec + 64 * rw)[t] = o.s0;
    reinterpret_cast<uint4*>(rec + 8 * kRec + 64 * rw)[t] = o.s1;
    if (t == 0) {
      reinterpret_cast<uint2*>(rec + 512)[rw] = make_uint2(__float_as_uint(o.i0), uint32_t(o.sx0));
      reinterpret_cast<uint2*>(rec + 8 * kRec + 512)[rw] = make_uint2(__float_as_uint(o.i1), uint32_t(o.sx1));
    }
  }
}

// 4 bytes at shared address a, a % 4 == 2 when ODD (else 0)
template <bool ODD>
__device__ __forceinline__ uint32_t gi_ld4(uint32_t a) {
  if constexpr (ODD) return __byte_perm(lds_u16(a), lds_u16(a + 2), 0x5410u);
  else return lds_u32(a);
}

// One block's sums of row pair (g, g + 8) folded into acc[e0] / acc[e0 + 2] (column e0 = 0 / 1) with its x step fi
// and sum of X sx
template <int F>
__device__ __forceinline__ void gi_fold(float& acc, int32_t dh, int32_t dl, float d, float mn, float fi, int32_t sx) {
  const int32_t s = dh * 256 + dl;
  if constexpr (GI<F>::kMin) acc = fmaf(fmaf(float(s), d, float(sx) * mn), fi, acc);
  else if constexpr (GI<F>::kQ8) acc = fmaf(float(s), d * fi, acc);
  else acc = fmaf(float(s - 8 * sx), d * fi, acc);
}

template <int F, int D, bool MULTI>
__global__ void __launch_bounds__(256, 2) k_ggi(const QGemvArgs p) {
  static_assert(D == 2 || D == 3, "a ring of 2 or 3 stages");
  using L = GIL<F>;
  using I = GI<F>;
  constexpr int BB = I::BB, P = L::P, NC = L::NC, NK = (NC + 7) / 8;
  constexpr int STG = MULTI ? L::W : L::STG;
  const int M = MULTI ? int(p.m) : 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int64_t nst = p.k / 512;
  const int64_t parts = int64_t(gridDim.y) * nw, pi = int64_t(blockIdx.y) * nw + warp;
  const int64_t s0 = nst * pi / parts, s1 = nst * (pi + 1) / parts;  // the warp's stages
  const int nstw = int(s1 - s0);

  extern __shared__ uint4 smem[];
  const uint32_t ring = smem_addr(smem) + uint32_t(warp) * uint32_t(D * STG);
  // the lane's copies: chunks ch + 8 k of rows rr + 4 i (past the last row: the last one, never stored)
  const int ch = lane & 7, rr = lane >> 3;
  const uint8_t* qp[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + rr + 4 * i < p.n ? row0 + rr + 4 * i : p.n - 1;
    qp[i] = static_cast<const uint8_t*>(p.q) + row * p.q_rs + s0 * L::RB + ch * 16;
  }
  const uint32_t cdst = uint32_t(rr * P + ch * 16);
  const uint8_t* xsrc = static_cast<const uint8_t*>(p.x) + s0 * 1024 + 16 * lane;

  int issued = 0;  // stages issued (weights)
  auto issue_w = [&](uint32_t sb) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int k = 0; k < NK; ++k)
        if (NC % 8 == 0 || ch + 8 * k < NC) cp_async16(sb + cdst + uint32_t(4 * i * P + 128 * k), qp[i] + 128 * k);
#pragma unroll
    for (int i = 0; i < 4; ++i) qp[i] += L::RB;
  };
  auto issue_x = [&](uint32_t sb) {
    if constexpr (!MULTI) {
      const uint32_t d = sb + uint32_t(L::XOFF + 16 * lane);
      cp_async16_ca(d, xsrc);
      cp_async16_ca(d + 512, xsrc + 512);
      xsrc += 1024;
    }
  };

  pdl_trigger();
#pragma unroll
  for (int s = 0; s < D - 1; ++s) {
    if (issued < nstw) issue_w(ring + uint32_t(s * STG)), ++issued;
    cp_commit();
  }
  pdl_wait();
#pragma unroll
  for (int s = 0; s < D - 1; ++s)
    if (s < nstw) issue_x(ring + uint32_t(s * STG));
  cp_commit();

  // acc: (row g, column 2 t), (row g, 2 t + 1), (row g + 8, 2 t), (row g + 8, 2 t + 1); at M = 1 every column of B is
  // x, so [0] / [2] of every lane are the rows' values ([1] / [3] unused)
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  // MULTI: k_ggi_xprep's records: the lane's column of B (x row g, slot t) and the steps and sums of x rows 2 t, 2 t + 1
  [[maybe_unused]] const uint4* gx = reinterpret_cast<const uint4*>(p.w4x) + 4 * g + t;
  [[maybe_unused]] const uint4* gmeta = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(p.w4x) + 512) + t;
  int slot = 0;
#pragma unroll 1
  for (int s = 0; s < nstw; ++s) {
    // the next stage into the slot of stage s - 1 (its reads ended before this __syncwarp)
    __syncwarp();
    if (issued < nstw) {
      const uint32_t nb = ring + uint32_t(((slot + D - 1) % D) * STG);
      issue_w(nb);
      issue_x(nb);
      ++issued;
    }
    cp_commit();
    if (D > 2 && s == 0) cp_wait<D - 2>();  // groups: weights 0 .. D - 2, their x, then one per stage
    else cp_wait<D - 1>();
    __syncwarp();
    const uint32_t sb = ring + uint32_t(slot * STG);
    if constexpr (!MULTI) {  // ---- the stage's x to planes in place ----
      const uint32_t xa = sb + uint32_t(L::XOFF);
      const int bA = lane >> 2;
      const GiConv o = gi_convert(lds8(xa + uint32_t(2 * (32 * bA + 4 * t))), lds8(xa + uint32_t(2 * (32 * bA + 16 + 4 * t))),
                                  lds8(xa + uint32_t(2 * (32 * bA + 256 + 4 * t))),
                                  lds8(xa + uint32_t(2 * (32 * bA + 272 + 4 * t))));
      __syncwarp();  // every lane's x read before the planes overwrite it
      sts16(xa + uint32_t(16 * lane), o.s0);
      sts16(xa + uint32_t(16 * (32 + lane)), o.s1);
      if (t == 0) {
        const uint32_t ma = sb + uint32_t(L::MOFF + 8 * bA);
        asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(ma), "r"(__float_as_uint(o.i0)), "r"(uint32_t(o.sx0))
                     : "memory");
        asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(ma + 64u), "r"(__float_as_uint(o.i1)),
                     "r"(uint32_t(o.sx1)) : "memory");
      }
      __syncwarp();
    }
    // ---- the stage's 16 blocks ----
    const uint32_t ra = sb + uint32_t(g * P), rb = ra + uint32_t(8 * P);
    const int64_t blk0 = (s0 + s) * 16;  // the stage's first block in the row
#pragma unroll
    for (int bb = 0; bb < 16; ++bb) {
      const bool odd = ((bb * BB + I::QOFF) & 2) != 0;  // the codes' address % 4 == 2 (known after unrolling)
      const uint32_t oa = ra + uint32_t(bb * BB), ob = rb + uint32_t(bb * BB);
      uint32_t a[4];
      const auto ld = [&](uint32_t x) { return odd ? gi_ld4<true>(x) : gi_ld4<false>(x); };
      if constexpr (I::kQ8) {
        a[0] = ld(oa + I::QOFF + 4 * t);
        a[1] = ld(ob + I::QOFF + 4 * t);
        a[2] = ld(oa + I::QOFF + 16 + 4 * t);
        a[3] = ld(ob + I::QOFF + 16 + 4 * t);
      } else {
        const uint32_t ua = ld(oa + I::QOFF + 4 * t), ub = ld(ob + I::QOFF + 4 * t);
        a[0] = ua & 0x0f0f0f0fu;
        a[1] = ub & 0x0f0f0f0fu;
        a[2] = (ua >> 4) & 0x0f0f0f0fu;
        a[3] = (ub >> 4) & 0x0f0f0f0fu;
      }
      const float da = f16f(lds_u16(oa)), db = f16f(lds_u16(ob));
      const float ma = I::kMin ? f16f(lds_u16(oa + 2)) : 0.0f, mb = I::kMin ? f16f(lds_u16(ob + 2)) : 0.0f;
      const int64_t bg = blk0 + bb;  // the block's index in the row
      const uint4 xv = MULTI ? __ldg(gx + bg * (kRec / 16)) : lds16(sb + uint32_t(L::XOFF + 16 * (4 * bb + t)));
      [[maybe_unused]] const uint4 m2 = MULTI ? __ldg(gmeta + bg * (kRec / 16)) : make_uint4(0u, 0u, 0u, 0u);
      const uint2 meta = MULTI ? make_uint2(m2.x, m2.y) : lds8(sb + uint32_t(L::MOFF + 8 * bb));
      int32_t dh[4] = {0, 0, 0, 0}, dl[4] = {0, 0, 0, 0};
      if constexpr (I::kQ8) {
        imma_ss(dh, a, xv.x, xv.y);
        imma_su(dl, a, xv.z, xv.w);
      } else {
        imma_us(dh, a, xv.x, xv.y);
        imma_uu(dl, a, xv.z, xv.w);
      }
      const float fi = __uint_as_float(meta.x);
      const int32_t sx = int32_t(meta.y);
      gi_fold<F>(acc[0], dh[0], dl[0], da, ma, fi, sx);
      gi_fold<F>(acc[2], dh[2], dl[2], db, mb, fi, sx);
      if constexpr (MULTI) {  // column 2 t + 1: its own row of x
        const float fi1 = __uint_as_float(m2.z);
        const int32_t sx1 = int32_t(m2.w);
        gi_fold<F>(acc[1], dh[1], dl[1], da, ma, fi1, sx1);
        gi_fold<F>(acc[3], dh[3], dl[3], db, mb, fi1, sx1);
      }
    }
    slot = slot + 1 == D ? 0 : slot + 1;
  }
  cp_wait<0>();

  // the warps' sums, added in warp order (through the ring memory, free now)
  float* red = reinterpret_cast<float*>(smem);  // [nw][32][4]
  float4 ws = make_float4(acc[0], acc[1], acc[2], acc[3]);
  cta_sums4_put(red, acc, warp, lane, nw);
  if (warp != 0) return;
  if (nw > 1) ws = warps_sum4(red + lane * 4, 32 * 4, nw);
  const int S = gridDim.y, sl = blockIdx.y;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int m = 2 * t + (e & 1);
    const int64_t row = row0 + g + (e >= 2 ? 8 : 0);
    if (m < M && row < p.n) {
      const float v = f4_get(ws, e);
      if (S == 1) store_out(p.y, p.out_dtype, m * p.n + row, v);
      else p.part[(int64_t(sl) * M + m) * p.n + row] = v;
    }
  }
}

// ---- host: the switch, the plan, the launch ----

constexpr int kSMs = 132;
constexpr int kSmemMax = 200 * 1024;    // dynamic shared memory of one CTA at most
constexpr int kSmemPerSm = 220 * 1024;  // what the CTAs of one SM may use together
constexpr int64_t kSmSmem = 228 * 1024;
constexpr int kWt = 16;  // target warps per SM
constexpr int kD = 2;    // ring depth

// The formats that take this kernel when GPUKIT_GGUF_IMMA is unset (a bit per QFormat value): none. Session 17
// (docs/device-runs/2026-12-01-h200-s17-{A,B}.log; % of copy, (K, N) = (4096, 14336) / (14336, 4096) / (4096, 128256)
// / (4096, 6144) / (4096, 4096), staged -> this kernel, run B): M = 1 Q4_0 57 / 55 / 78 / 46 / 39 -> 62 / 60 / 83 / 47 /
// 43, Q4_1 59 / 58 / 82 / 49 / 41 -> 72 / 69 / 88 / 52 / 46, Q8_0 73 / 73 / 93 / 58 / 55 -> 73 / 76 / 89 / 68 / 59;
// but M = 4 Q4_0 51 / 49 / 70 / 42 / 35 -> 47 / 43 / 69 / 36 / 31 and Q4_1 53 / 53 / 74 / 45 / 38 -> 50 / 47 / 73 /
// 37 / 34 (M = 8: 43 / 43 / 56 / 37 / 31 -> 47 / 45 / 68 / 35 / 32 for Q4_0): a row's bits must not depend on M, so
// the M = 1 gain cannot be taken alone. tests/python/test_gguf_imma_cuda.py names the set too (DEFAULT_IMMA).
constexpr unsigned kImmaDefault = 0u;
constexpr unsigned kImmaAll =
    (1u << int(QFormat::q4_0)) | (1u << int(QFormat::q4_1)) | (1u << int(QFormat::q8_0));

// GPUKIT_GGUF_IMMA: "1" Q4_0 / Q4_1 / Q8_0, "0" none, or format names ("q4_0,q8_0"); unset: kImmaDefault.
unsigned imma_formats() {
  const char* e = std::getenv("GPUKIT_GGUF_IMMA");
  if (!e || !*e) return kImmaDefault;
  const std::string v(e);
  if (v == "1") return kImmaAll;
  if (v == "0") return 0u;
  unsigned r = 0;
  size_t i = 0;
  while (i <= v.size()) {
    size_t j = v.find(',', i);
    if (j == std::string::npos) j = v.size();
    const std::string name = v.substr(i, j - i);
    if (name == "q4_0") r |= 1u << int(QFormat::q4_0);
    else if (name == "q4_1") r |= 1u << int(QFormat::q4_1);
    else if (name == "q8_0") r |= 1u << int(QFormat::q8_0);
    else throw ValueError(cat("GPUKIT_GGUF_IMMA: expected 0, 1 or a list of q4_0, q4_1, q8_0, got '", e, "'"));
    i = j + 1;
  }
  return r;
}

// Warps per CTA: about kWt warps per SM over the GPU, 1..8 per 16 rows, at least one stage per warp (of its split
// slice), within the shared memory, and few enough that all CTAs fit at once when there are at most a few per SM
// (registers for 16 warps per SM). A function of (N, K, split, format).
int gi_warps(int64_t n, int64_t k, int split, int64_t ring) {
  const int64_t nst = k / 512, rb = (n + 15) / 16, want = int64_t(kSMs) * kWt;
  int64_t w = (want + rb / 2) / rb;
  w = std::min<int64_t>(std::max<int64_t>(w, 1), 8);
  w = std::min<int64_t>(w, std::max<int64_t>(nst / split, 1));
  w = std::min<int64_t>(w, kSmemMax / ring);
  const int64_t per_sm = (rb * split + kSMs - 1) / kSMs;
  w = std::max<int64_t>(std::min<int64_t>(w, kSmemPerSm / (per_sm * (ring + 256))), 1);
  w = std::max<int64_t>(std::min<int64_t>(w, int64_t(16) / per_sm), 1);
  return int(w);
}

// The dynamic shared memory: when all CTAs fit at once, enough that at most ceil(CTAs / 132) fit on one SM (the
// block scheduler then spreads them evenly; as k_w4i's launches).
int gi_smem(int need, int64_t ctas) {
  if (need > kSmemMax) throw ValueError("gemv: the integer GGUF kernel's shared memory does not fit");
  int smem = need;
  const int64_t per_sm = (ctas + kSMs - 1) / kSMs;
  if (per_sm >= 1 && per_sm <= 16) {
    const int64_t cap = kSmSmem / (per_sm + 1) - 1024 - 512 + 256;  // just too much for per_sm + 1 CTAs
    if (per_sm * (cap + 1024 + 512) <= kSmSmem && cap > smem) smem = int(std::min<int64_t>(cap, kSmemMax));
  }
  return smem;
}

template <int F>
void launch_fmt(const QGemvArgs& p, cudaStream_t st) {
  using L = GIL<F>;
  const int64_t blocks = (p.n + 15) / 16;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  const int split = std::max(1, p.split);
  const int nw = gi_warps(p.n, p.k, split, int64_t(kD) * L::STG);
  if (p.m == 1) {
    smem_limit<k_ggi<F, kD, false>>(kSmemMax);
    const int smem = gi_smem(std::max(nw * kD * L::STG, nw * 32 * 4 * 4), blocks * split);
    launch_ex(k_ggi<F, kD, false>, dim3(unsigned(blocks), unsigned(split)), nw * 32, smem, st, p.variant != 2, p);
  } else {  // x's planes once per call, then the GEMV on the same plan without x in its ring
    if (!p.w4x) throw ValueError("gemv: the integer GGUF kernel needs its x workspace at M > 1 (internal)");
    launch_ex(k_ggi_xprep, dim3(unsigned(p.k / 512), unsigned(p.m)), 32, 0, st, p.variant != 2, p);
    GK_LAUNCH_CHECK("qgemv_ggi_xprep");
    smem_limit<k_ggi<F, kD, true>>(kSmemMax);
    const int smem = gi_smem(std::max(nw * kD * L::W, nw * 32 * 4 * 4), blocks * split);
    launch_ex(k_ggi<F, kD, true>, dim3(unsigned(blocks), unsigned(split)), nw * 32, smem, st, p.variant != 2, p);
  }
  GK_LAUNCH_CHECK("qgemv_ggi");
  if (split > 1) launch_sum_q(p, st);
}

}  // namespace

bool gguf_imma_runs(const QGemvArgs& p) {
  if (p.fmt != QFormat::q4_0 && p.fmt != QFormat::q4_1 && p.fmt != QFormat::q8_0) return false;
  if (p.x_dtype != DType::bf16 || p.m < 1 || p.m > 8 || p.k % 512 != 0 || (p.variant != 0 && p.variant != 2))
    return false;
  if (!gguf_st_applies(p)) return false;  // 16-byte aligned rows of q and x
  return (imma_formats() >> int(p.fmt)) & 1u;
}

int64_t gguf_imma_workspace(const QGemvArgs& p) {
  if (p.m < 2 || !gguf_imma_runs(p)) return 0;
  return (p.k / 32) * kRec;
}

void launch_gguf_imma(const QGemvArgs& p, cudaStream_t st) {
  if (p.m <= 0 || p.n <= 0) return;
  switch (p.fmt) {
    case QFormat::q4_0: return launch_fmt<int(QFormat::q4_0)>(p, st);
    case QFormat::q4_1: return launch_fmt<int(QFormat::q4_1)>(p, st);
    case QFormat::q8_0: return launch_fmt<int(QFormat::q8_0)>(p, st);
    default: throw ValueError("gemv: not a format of the integer GGUF kernel");
  }
}

}  // namespace gk::cuda
