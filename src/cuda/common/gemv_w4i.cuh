// int4 (groups of 128) decode GEMV with bf16 x at M <= 8 on the INTEGER tensor cores (session 14; variants 63-66 of
// the staged 4-bit kernel, src/cuda/gemv_w4_staged.cu; NEW NUMERICS: x as 16-bit fixed point per 128-weight block).
//
// Why: k_w4 (common/gemv_w4.cuh) turns every 8 codes into bf16 pairs with 3 shifts, 4 lop3 and 4 packed subtractions
// per row (11 instructions per 8 weights); Nsight Compute (session 13) shows it latency / issue bound at ~164 warp
// instructions per KB of codes. Here a code word becomes two u8 registers in 3 instructions (u & 0x0f0f0f0f,
// (u >> 4) & 0x0f0f0f0f) that feed mma.sync.m16n8k32 (u8 x s8 / u8 -> s32, exact) directly, and the zero point
// moves to the end of each block: sum_k (q_k - z) X_k = sum_k q_k X_k - z sum_k X_k.
//
// x: each 128-element block b of x (one group of every row) becomes X = round(x 2^(141 - e_b)) with e_b the biased
// bf16 exponent of the block's largest |x| (clamped to 15..254): |X| < 2^15, and x = X 2^(e_b - 141) exactly for
// every element within 2^7 of the block's largest (its bf16 ulp is a multiple of the fixed point's); smaller
// elements are rounded to a multiple of 2^(e_b - 141) (absolute error <= 2^(e_b - 142) <= 2^-15 |largest|).
// X = 256 h + l with h in [-128, 127] (s8) and l in [0, 255] (u8), so sum q X = 256 sum q h + sum q l: two mma per
// 32 k, exact in int32. The conversion is one fma per element: the bits of x 2^(141 - e) + 1.5 2^23 are
// 0x4B400000 + X, whose bytes 0 / 1 are l / h. A block holding inf or NaN gives NaN in every output of its x row.
//
// At M = 1 each warp converts its stage's x in place (after the wait for the stage's bytes; at M > 1 k_w4i_xprep does
// it once per call, with the same w4i_convert): 16 elements per lane, the block maxima and the block sums of X over
// 16 lanes by 4 shuffles, the planes stored in the order the mma reads them:
// 16-byte slot 16 b + 4 j + t holds (b0 of h, b1 of h, b0 of l, b1 of l) of the elements 128 b + 32 t + 8 j .. + 7
// (b0: the even ones, b1: the odd ones, matching the codes' low / high nibbles), so lane (g, t) reads one slot per
// mma and every quad reads the same x (all 8 columns of B are x: at M = 1 every lane's c0 / c2 is the result).
//
// Plan, copies and bits: as k_w4 (a CTA owns 16 rows and nw warps; the warps split K in stages of 4 blocks; a ring
// of D stages per warp; the codes, scales and zero points of the first stage copied before the PDL wait, x after;
// the next stage's copies issued before the wait for this one; the warps' sums in warp order, split-K slices by the
// second pass). Integer sums are exact, every float operation has a fixed order: the same bits every run, and a
// row's value does not depend on the plan's split of K within a block (a block is never split).
// Requires K % 512 == 0, 16-byte aligned code rows, scale rows and x, 4-byte aligned zero-point rows (the wide
// k_w4's conditions); the launcher checks them.
#pragma once
#include "gemv_stage.cuh"
#include "imma.cuh"
#include "gemv_w4_layout.cuh"
#include "gemv_w4_ops.cuh"
#include "ops/nn_args.h"

namespace gk::cuda::gemv_detail {

// The stage's layout after W4Layout<W4Int4<128>, 4>'s codes / scales / zero points (M = 1): x (1 KB, bf16 as copied,
// then the planes in place), then per block (f32 2^(c - 141) or NaN, s32 sum of X). M > 1: the codes, scales and
// zero points only (L::STAGE bytes).
struct W4iLayout {
  using F = W4Int4<128>;
  using L = W4Layout<F, 4>;
  static constexpr int KB = 4, XOFF = L::STAGE, XB = KB * 256, MB = KB * 8, MOFF = XOFF + XB, STG = MOFF + MB;
  static_assert(L::SP == 16 && L::ZP == 4 && STG % 16 == 0, "int4 g128 stages of 4 blocks");
};

// One 16-byte chunk of bf16 x (8 elements, k0 .. k0 + 7) as the planes' slot and its sum of X (0x4B400000 excess
// removed). f: 2^(141 - e) of its block.
__device__ __forceinline__ uint4 w4i_planes(const uint4& v, float f, int32_t& sum) {
  constexpr float kMagic = 12582912.0f;  // 1.5 2^23
  uint32_t b[8];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint32_t u = word(v, w);
    b[2 * w] = __float_as_uint(fmaf(__uint_as_float(u << 16), f, kMagic));
    b[2 * w + 1] = __float_as_uint(fmaf(__uint_as_float(u & 0xffff0000u), f, kMagic));
  }
  sum = int32_t(b[0] + b[1] + b[2] + b[3] + b[4] + b[5] + b[6] + b[7] - 8u * 0x4B400000u);
  // (l0 l2 h0 h2), (l4 l6 h4 h6) -> (h0 h2 h4 h6), (l0 l2 l4 l6); the same for the odd elements
  const uint32_t e02 = __byte_perm(b[0], b[2], 0x5140u), e46 = __byte_perm(b[4], b[6], 0x5140u);
  const uint32_t o13 = __byte_perm(b[1], b[3], 0x5140u), o57 = __byte_perm(b[5], b[7], 0x5140u);
  return make_uint4(__byte_perm(e02, e46, 0x7632u), __byte_perm(o13, o57, 0x7632u), __byte_perm(e02, e46, 0x5410u),
                    __byte_perm(o13, o57, 0x5410u));
}

// MULTI: 1 < M <= 8 (the M = 1 launch's plan; column m of B is x row m, rows past M read row M - 1): x's planes,
// block exponents and sums come from k_w4i_xprep (w4i_convert: the same integers as at M = 1), read from global
// memory (L1 / L2) instead of the ring, and a row's value is computed by the same operations as at M = 1 (the same
// fold per block, the same order), so a row of x gives the same bits alone or in a batch.
// One stage (512 elements) of one x row to the planes, all 32 lanes (shuffles): v0 / v1 the bf16 chunks lane and
// lane + 32 (blocks lane / 16 and 2 + lane / 16). Returns the lane's two slots of planes (pl0 at slot sl, pl1 at
// sl + 32) and, for its two blocks, 2^(c - 141) (NaN where the block holds inf / NaN) and the block's sum of X (the
// same in all 16 lanes of a half). The GEMV at M = 1 and the conversion kernel of M > 1 both call this: the same X.
struct W4iConv {
  uint4 pl0, pl1;
  float i0, i1;
  int32_t sx0, sx1;
  int sl;
};
__device__ __forceinline__ W4iConv w4i_convert(const uint4& v0, const uint4& v1, int lane) {
  W4iConv o;
  uint32_t m0 = 0, m1 = 0;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    m0 = w4i_umax2(m0, word(v0, w) & 0x7fff7fffu);  // |bf16| orders as its bits (inf, NaN above the finite)
    m1 = w4i_umax2(m1, word(v1, w) & 0x7fff7fffu);
  }
  uint32_t pk = w4i_umax2(__byte_perm(m0, m1, 0x5410u), __byte_perm(m0, m1, 0x7632u));  // (max v0, max v1)
#pragma unroll
  for (int off = 1; off < 16; off <<= 1) pk = w4i_umax2(pk, __shfl_xor_sync(0xffffffffu, pk, off));
  const int e0 = int(pk >> 7) & 0xff, e1 = int(pk >> 23);
  const int c0 = min(max(e0, 15), 254), c1 = min(max(e1, 15), 254);
  const float f0 = __uint_as_float(uint32_t(268 - c0) << 23), f1 = __uint_as_float(uint32_t(268 - c1) << 23);
  o.pl0 = w4i_planes(v0, f0, o.sx0);
  o.pl1 = w4i_planes(v1, f1, o.sx1);
#pragma unroll
  for (int off = 1; off < 16; off <<= 1) {
    o.sx0 += __shfl_xor_sync(0xffffffffu, o.sx0, off);
    o.sx1 += __shfl_xor_sync(0xffffffffu, o.sx1, off);
  }
  o.i0 = e0 == 255 ? __uint_as_float(0x7fc00000u) : __uint_as_float(uint32_t(c0 - 14) << 23);
  o.i1 = e1 == 255 ? __uint_as_float(0x7fc00000u) : __uint_as_float(uint32_t(c1 - 14) << 23);
  const int c = lane & 15;  // chunk c = 16 b + 4 t' + j' -> slot 16 b + 4 j' + t'
  o.sl = (lane & 16) + 4 * (c & 3) + (c >> 2);
  return o;
}

// M > 1: x [M, K] bf16 (rows x_rs apart) -> p.w4x. REC false: the planes [M][K / 128 blocks][256 bytes: 16 slots as in
// a stage] (M K 2 bytes), then per row and block (f32 2^(c - 141) or NaN, s32 sum of X) (M K / 16 bytes). REC true
// (session 17): per 128-element block a record of kW4iRec bytes: the planes of x rows 0..7 (256 bytes each; rows
// past M unwritten, the GEMV's lanes read row min(g, M - 1)), then (f32, s32) of rows 0..7 with rows M..7 repeating
// row M - 1, so a lane reads its two accumulator columns' (rows 2 t, 2 t + 1) exponents and sums with one 16-byte load
// and a block's x for the warp lies in one record. The same values either way. Grid (K / 512, M), one warp each. The GEMV launched
// after it (PDL) reads them after its wait.
constexpr int kW4iRec = 8 * 256 + 8 * 8;
template <bool REC>
__global__ void __launch_bounds__(32) k_w4i_xprep(const QGemvArgs p) {
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x;
  const int64_t st = blockIdx.x, r = blockIdx.y, nblk = p.k / 128;
  const uint4* xs = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(p.x) + r * p.x_rs * 2 + st * 1024);
  const W4iConv o = w4i_convert(__ldg(xs + lane), __ldg(xs + lane + 32), lane);
  if constexpr (REC) {
    uint8_t* rec = static_cast<uint8_t*>(p.w4x) + st * 4 * kW4iRec;  // the stage's first block's record
    const int b0 = o.sl >> 4, sw = o.sl & 15;  // slot sl: block sl / 16 (pl1: 2 more), slot sl % 16 of it
    reinterpret_cast<uint4*>(rec + b0 * kW4iRec + 256 * r)[sw] = o.pl0;
    reinterpret_cast<uint4*>(rec + (b0 + 2) * kW4iRec + 256 * r)[sw] = o.pl1;
    const int64_t r1 = r + 1 == p.m ? 8 : r + 1;  // the exponent and sum rows this warp writes: r (the last: M - 1 .. 7)
    for (int64_t rw = r; rw < r1; ++rw) {
      if ((lane & 15) == 0) {  // lanes 0 / 16: blocks 0, 2 / 1, 3 of the stage
        const int bl = lane >> 4;
        reinterpret_cast<uint2*>(rec + bl * kW4iRec + 2048)[rw] = make_uint2(__float_as_uint(o.i0), uint32_t(o.sx0));
        reinterpret_cast<uint2*>(rec + (bl + 2) * kW4iRec + 2048)[rw] = make_uint2(__float_as_uint(o.i1), uint32_t(o.sx1));
      }
    }
  } else {
    uint4* pl = reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.w4x) + r * p.k * 2 + st * 1024);
    pl[o.sl] = o.pl0;
    pl[o.sl + 32] = o.pl1;
    if ((lane & 15) == 0) {  // lanes 0 / 16: blocks 0, 2 / 1, 3 of the stage
      uint2* meta = reinterpret_cast<uint2*>(static_cast<uint8_t*>(p.w4x) + p.m * p.k * 2) + r * nblk + st * 4 + (lane >> 4);
      meta[0] = make_uint2(__float_as_uint(o.i0), uint32_t(o.sx0));
      meta[2] = make_uint2(__float_as_uint(o.i1), uint32_t(o.sx1));
    }
  }
}

// SW (QGemvArgs::swiglu; gemv_quantized_swiglu): the weight is [gate; up] (n = 2 I rows) and y [M, I] = silu(g) * u,
// g and u rounded to y's type first: the bits of the GEMV's output then k_swiglu (gated_fn, the same float operations).
// CTA b's 16 rows are gate rows 8 b .. 8 b + 7 (local rows 0-7) and up rows I + 8 b .. (8-15), so a lane holds a pair
// (row g, row g + 8) in acc[0 / 1], acc[2 / 3]. The plan (warps, stages, split = 1) is the n = 2 I GEMV's and a row's
// sum does not depend on its place in the grid: g and u are the plain GEMV's values bit for bit.
template <class O>
__device__ __forceinline__ void store_swiglu_as(void* y, int64_t i, float g, float u) {
  static_cast<O*>(y)[i] = convert<O>(gated_fn<nn::GatedAct::SwiGLU, float>(float(convert<O>(g)), float(convert<O>(u))));
}
__device__ __forceinline__ void store_swiglu(void* y, DType t, int64_t i, float g, float u) {
  if (t == DType::bf16) store_swiglu_as<bf16>(y, i, g, u);
  else if (t == DType::f16) store_swiglu_as<f16>(y, i, g, u);
  else store_swiglu_as<float>(y, i, g, u);
}

template <int D, int MINB, bool MULTI = false, bool SW = false, bool REC = false>
__global__ void __launch_bounds__(256, MINB) k_w4i(const QGemvArgs p) {
  static_assert(D == 2 || D == 3, "a ring of 2 or 3 stages");
  static_assert(!REC || MULTI, "records: M > 1 only");
  using WL = W4iLayout;
  using L = WL::L;
  constexpr int KB = WL::KB, P = L::P;
  const int M = MULTI ? int(p.m) : 1;
  constexpr int STG = MULTI ? L::STAGE : WL::STG;  // MULTI: no x in the ring
  constexpr uint32_t MOFF = uint32_t(WL::MOFF);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int64_t nblk = p.k / 128, nst = nblk / KB;
  const int64_t parts = int64_t(gridDim.y) * nw, pi = int64_t(blockIdx.y) * nw + warp;
  const int64_t s0 = nst * pi / parts, s1 = nst * (pi + 1) / parts;  // the warp's stages
  const int nstw = int(s1 - s0);
  const int64_t b0 = s0 * KB;

  extern __shared__ uint4 smem[];
  const uint32_t ring = smem_addr(smem) + uint32_t(warp) * uint32_t(D * STG);
  // the lane's copies of a stage (addresses computed once): codes, rows rr + 4 i, chunks ch, ch + 8 (swizzled);
  // lanes 0-15 the 16 bytes of scales of row lane, lanes 16-31 the 4 zero-point bytes of row lane - 16; x chunks
  // lane and lane + 32
  // the weight row of the CTA's local row r (past the last row: the last one, never stored)
  const auto row_of = [&](int r) -> int64_t {
    if constexpr (SW) {
      const int64_t I = p.n / 2, j = int64_t(blockIdx.x) * 8 + (r & 7), jc = j < I ? j : I - 1;
      return r < 8 ? jc : I + jc;
    } else {
      return row0 + r < p.n ? row0 + r : p.n - 1;
    }
  };
  const int ch = lane % 8, rr = lane / 8;
  const uint8_t* qp[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) qp[i] = static_cast<const uint8_t*>(p.q) + row_of(rr + 4 * i) * p.q_rs + b0 * 64 + ch * 16;
  const uint32_t cd0 = uint32_t(rr * P + ((ch ^ w4_swz(rr)) * 16));
  const uint32_t cd1 = uint32_t((rr + 4) * P + ((ch ^ w4_swz(rr + 4)) * 16)) - uint32_t(4 * P);
  const int mr = lane & 15;
  const int64_t mrow = row_of(mr);
  const uint8_t* msrc = lane < 16 ? reinterpret_cast<const uint8_t*>(p.scales) + (mrow * nblk + b0) * 4
                                  : p.zeros + mrow * nblk + b0;
  const uint32_t mdst = lane < 16 ? uint32_t(L::CODES + mr * L::SP) : uint32_t(L::CODES + L::SCALES + mr * L::ZP);
  const uint8_t* xsrc = static_cast<const uint8_t*>(p.x) + b0 * 256 + 16 * lane;

  int issued = 0;  // stages issued (weights)
  auto issue_w = [&](uint32_t sb) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int k = 0; k < 2; ++k) cp_async16(sb + ((i & 1) ? cd1 : cd0) + uint32_t(4 * i * P + 128 * k), qp[i] + 128 * k);
    if (lane < 16) cp_async16(sb + mdst, msrc);
    else cp_async_u<4>(sb + mdst, msrc);
#pragma unroll
    for (int i = 0; i < 4; ++i) qp[i] += KB * 64;
    msrc += lane < 16 ? KB * 4 : KB;
  };
  auto issue_x = [&](uint32_t sb) {
    if constexpr (!MULTI) {
      const uint32_t d = sb + uint32_t(WL::XOFF + 16 * lane);
      cp_async16_ca(d, xsrc);
      cp_async16_ca(d + 512, xsrc + 512);
      xsrc += KB * 256;
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

  const int sw = w4_swz(g);
  // acc: (row g, column 2 t), (row g, 2 t + 1), (row g + 8, 2 t), (row g + 8, 2 t + 1); at M = 1 every column of B is
  // x, so [0] / [2] of every lane are the rows' values ([1] / [3] unused)
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const uint32_t xb = uint32_t(WL::XOFF);  // M = 1: the stage's planes
  const int mc0 = min(2 * t, M - 1), mc1 = min(2 * t + 1, M - 1);  // the x rows of columns 2 t, 2 t + 1
  // MULTI: the lane's column of B (x row g) in k_w4i_xprep's planes, the rows' block exponents and sums
  [[maybe_unused]] const uint4* gx =
      MULTI ? reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(p.w4x) + int64_t(min(g, M - 1)) * p.k * 2)
            : nullptr;
  [[maybe_unused]] const uint2* gmeta =
      MULTI ? reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(p.w4x) + p.m * p.k * 2) : nullptr;
  // MULTI with REC: k_w4i_xprep's records (the lane's x row g, slot t; rows 2 t, 2 t + 1's exponents and sums)
  [[maybe_unused]] const uint4* rx = reinterpret_cast<const uint4*>(p.w4x) + min(g, M - 1) * 16 + t;
  [[maybe_unused]] const uint4* rm = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(p.w4x) + 2048) + t;
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
      const uint32_t xa = sb + uint32_t(WL::XOFF);
      const W4iConv o = w4i_convert(lds16(xa + uint32_t(16 * lane)), lds16(xa + uint32_t(16 * (lane + 32))), lane);
      __syncwarp();  // every lane's x read before the planes overwrite it
      sts16(xa + uint32_t(16 * o.sl), o.pl0);
      sts16(xa + uint32_t(16 * (o.sl + 32)), o.pl1);
      if ((lane & 15) == 0) {  // lanes 0 / 16: blocks 0, 2 / 1, 3
        const uint32_t ma = sb + MOFF + uint32_t(8 * (lane >> 4));
        asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(ma), "r"(__float_as_uint(o.i0)), "r"(uint32_t(o.sx0))
                     : "memory");
        asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(ma + 16u), "r"(__float_as_uint(o.i1)),
                     "r"(uint32_t(o.sx1)) : "memory");
      }
      __syncwarp();
    }
    // ---- the stage's 4 blocks ----
    const uint4 sca = lds16(sb + uint32_t(L::CODES + g * L::SP)), scb = lds16(sb + uint32_t(L::CODES + (g + 8) * L::SP));
    const uint32_t za = lds_u32(sb + uint32_t(L::CODES + L::SCALES + g * L::ZP));
    const uint32_t zb = lds_u32(sb + uint32_t(L::CODES + L::SCALES + (g + 8) * L::ZP));
#pragma unroll
    for (int bb = 0; bb < KB; ++bb) {
      const uint32_t co = uint32_t(((4 * bb + t) ^ sw) * 16);
      const uint4 wa = lds16(sb + uint32_t(g * P) + co), wb = lds16(sb + uint32_t((g + 8) * P) + co);
      const int64_t bg = b0 + int64_t(s) * KB + bb;  // the block's index in the row
      [[maybe_unused]] const uint4 m2 = REC ? __ldg(rm + bg * (kW4iRec / 16)) : make_uint4(0u, 0u, 0u, 0u);
      const uint2 meta = REC ? make_uint2(m2.x, m2.y)
                             : (MULTI ? __ldg(gmeta + mc0 * nblk + bg) : lds8(sb + MOFF + uint32_t(8 * bb)));
      int32_t dh[4] = {0, 0, 0, 0}, dl[4] = {0, 0, 0, 0};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint4 xv = REC     ? __ldg(rx + bg * (kW4iRec / 16) + 4 * j)
                         : MULTI ? __ldg(gx + bg * 16 + 4 * j + t)
                                 : lds16(sb + xb + uint32_t(16 * (16 * bb + 4 * j + t)));
        const uint32_t ua = word(wa, j), ub = word(wb, j);
        const uint32_t a[4] = {ua & 0x0f0f0f0fu, ub & 0x0f0f0f0fu, (ua >> 4) & 0x0f0f0f0fu, (ub >> 4) & 0x0f0f0f0fu};
        imma_us(dh, a, xv.x, xv.y);
        imma_uu(dl, a, xv.z, xv.w);
      }
      const int32_t sx = int32_t(meta.y), zab = int32_t((za >> (8 * bb)) & 0xffu), zbb = int32_t((zb >> (8 * bb)) & 0xffu);
      const float fi = __uint_as_float(meta.x), sa = __uint_as_float(word(sca, bb)), sbv = __uint_as_float(word(scb, bb));
      acc[0] = fmaf(float(dh[0] * 256 + dl[0] - zab * sx), sa * fi, acc[0]);
      acc[2] = fmaf(float(dh[2] * 256 + dl[2] - zbb * sx), sbv * fi, acc[2]);
      if constexpr (MULTI) {  // column 2 t + 1: its own row of x
        const uint2 meta1 = REC ? make_uint2(m2.z, m2.w) : __ldg(gmeta + mc1 * nblk + bg);
        const int32_t sx1 = int32_t(meta1.y);
        const float fi1 = __uint_as_float(meta1.x);
        acc[1] = fmaf(float(dh[1] * 256 + dl[1] - zab * sx1), sa * fi1, acc[1]);
        acc[3] = fmaf(float(dh[3] * 256 + dl[3] - zbb * sx1), sbv * fi1, acc[3]);
      }
    }
    slot = slot + 1 == D ? 0 : slot + 1;
  }
  cp_wait<0>();

  // the warps' sums, added in warp order (through the ring memory, free now)
  // (ws formed before the barriers and summed after the other warps' return, as in session 15: a helper doing both
  // made the compiler lay this kernel out otherwise)
  float* red = reinterpret_cast<float*>(smem);  // [nw][32][4]
  float4 ws = make_float4(acc[0], acc[1], acc[2], acc[3]);
  cta_sums4_put(red, acc, warp, lane, nw);
  if (warp != 0) return;
  if (nw > 1) ws = warps_sum4(red + lane * 4, 32 * 4, nw);
  if constexpr (SW) {  // split 1 (the launcher's condition): lane (g, t) holds x rows 2 t, 2 t + 1 of gate / up row g
    const int64_t I = p.n / 2, j = int64_t(blockIdx.x) * 8 + g;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int m = 2 * t + e;
      if (m < M && j < I) store_swiglu(p.y, p.out_dtype, m * I + j, f4_get(ws, e), f4_get(ws, e + 2));
    }
    return;
  }
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

}  // namespace gk::cuda::gemv_detail
