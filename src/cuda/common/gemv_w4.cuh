// Decode GEMV of the 4-bit formats (int4 with group scales and zero points, groups of
// 32 / 64 / 128; NVF4: e2m1 codes with e4m3 scales per 16 weights and a tensor scale) on the
// tensor cores, with the access pattern of gemv8's staged kernel (common/gemv_w8.cuh): the
// H200 serves it at the copy rate (this kernel's copies alone, variant 7: 85-101% of copy at
// session 5's checkpoint A), while the per-lane rings of session 4 (quant_int4_lane.cu,
// removed) reached only 53-72% of copy with their copies alone.
//
// Plan (src/cuda/gemv_w4_staged.cu launches it):
// - a CTA owns 16 weight rows (the m16 of mma.m16n8k16) and nw warps (1..8, a function of N
//   and K only); the K range of its split-K slice is cut into stages of KB 64-byte blocks
//   (128 weights each), and warp w takes a contiguous run of whole stages. A stage is copied
//   global -> shared with cp.async: 16 rows x KB * 64 code bytes (each warp instruction moves
//   4 rows x 128 contiguous bytes), plus the rows' scales (and int4 zero points) of those
//   blocks (16 rows x KB * 16 / 32 / 64 bytes of f32 scales, KB * 1 / 2 / 4 zero bytes; NVF4:
//   KB * 8 e4m3 bytes), into a ring of D stages per warp (D - 1 in flight while one is
//   decoded; __syncwarp only; the default since session 6: D = 2). A partial last stage copies
//   what exists (zero-filled copies). At M = 1 the default (MODE 8) copies the stage's KB * 256
//   bytes of x with it and reads x from shared memory; M > 1 loads x from global memory.
// - the 16-byte chunks of row r are stored XOR-swizzled by bitrev3(r & 7), so the fragment
//   reads below (16, 8 or 4 bytes per lane) have no bank conflicts.
// - lane (g, t) decodes rows g and g + 8. Of each 128-weight block and each group h of it
//   (G = 128: one group; NVF4 is read like G = 128), the lane takes the G / 4 weights
//   h G + t G / 4 .. (G / 8 bytes): the quad reads one group together, so every mma k-step
//   lies in one group, whose fp32 mma sum is multiplied by the group's scale. A 32-bit word u
//   of 8 codes gives the pairs (p, p + 4) = (u >> 4p) & 0x000f000f | magic in one lop3
//   (bf16 128 + q, fp16 1024 + q) and one packed subtraction of (magic + z): (q - z) exactly.
//   Pairs (0, 4), (1, 5) are k-step A's columns (2t, 2t + 1), (2t + 8, 2t + 9), pairs (2, 6),
//   (3, 7) k-step B's; x (row g of B; rows past M read row M - 1, whose columns are dropped)
//   is loaded 8 elements at a time at the same physical k and paired by 4 byte permutes.
//   NVF4: the magnitude bits go to bf16 bits 6..8 (fp16 9..11): e2m1 * 2^-126 (2^-14, the
//   code 0.5 a subnormal of the same scale), times the block scale * 2^118 (2^7) whose sign
//   bits are xor-ed with the codes' signs: e2m1 * scale * 2^-8 (2^-7) exactly; the fp32 sum
//   is multiplied by 2^8 (2^7) and the tensor scale at the end.
// - the warps' sums are added in warp order; split-K slices (small N) are added in slice
//   order by the second pass. No atomics; the plan never depends on M: the same bits every
//   run, and a row of x gives the same bits alone or in a batch.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "gemv_stage.cuh"
#include "gemv_w4_layout.cuh"
#include "gemv_w4_ops.cuh"

namespace gk::cuda::gemv_detail {

// (the formats W4Int4 / W4Nvf4, the stage layout W4Layout, w4_swz, W4Frag: gemv_w4_layout.cuh)

// MODE (benchmarking): 0 the kernel; 1 the probe: the same copies and shared reads, no decode
// or products (wrong results: the ceiling of the access pattern); 3 lean (session 5 after A;
// the same arithmetic, the same bits): a full stage's copies from per-lane addresses computed
// once (no per-stage predicates, row clamps or byte counts) and the shared reads of a stage's
// first block before the next stage's copies are issued (their latency under the issue work);
// 5: 3 with x of a stage's first block loaded during the previous stage's last block (as within
// a stage); session 6: 7 the probe without x loads (x from opaque register moves; wrong
// results: the decode's ceiling); 8 (M = 1 only) x through the ring: each stage's KB * 256 bytes
// of x copied with its codes (cp.async; the stages issued before the PDL wait get theirs in one
// more group after it), read from shared memory at each block's start instead of global loads
// (the same arithmetic as MODE 0); 9 / 10: 8 / 0 with the loop over the ring's stages not
// unrolled (one full-stage body in the code instead of D; the same bits); session 7: 11 (codes in
// the natural order; int4 g128 with bf16 x in session 7, every format and x type since session 8): 8
// with the stage's x paired in place once per stage (x0 x4, x1 x5, .. : 8 byte permutes per lane and
// stage instead of 2 per mma; every quad reads the same x at M = 1) and x copied through L1
// (cp.async.ca: the CTAs of an SM read the same x; MODE 8 copies it with .cg, L2 only), the same
// bits; 12: 8 with x copied through L1 only; session 8: 13 (a ring of 3) 11 with stage 0's x copied right
// after the PDL wait and stage 1 after it (codes and x together), so the first stage waits for its own
// codes and x only (MODE 11 waits for all stages issued before the PDL wait); the same bits; session 9: 14 (int4
// g128, bf16 x, KB = 4; variant 61, NEW NUMERICS) 13 with the stage's x turned into fp16 times 2^e (w4_xhalf: e per
// warp and stage from the stage's largest |x|, x exact but for |x| < 2^-28 of that largest) instead of paired
// as bf16, the codes decoded as fp16 (w4_half_pairs: one shift per word instead of 3), f16 mma, 2^-e on the group
// scales; session 10: 15 (variant 62, a ring of 2) 11 with the next stage's copies issued BEFORE the wait for this
// stage's bytes (IF: MODE 11 waits, pairs x, then issues; the slot of the next stage held the previous one, free once
// its decode ended), so a waiting warp has two stages in flight instead of one (a ring of 3's bytes in flight in the
// ring of 2's shared memory), and with LEAN's copies (a full stage's code / scale / zero-point copies from addresses
// computed once: no per-stage row clamps, predicates or byte counts; x without per-chunk predicates; 558 -> 520 issued
// instructions per full stage, 290 -> 253 on the ALU pipe); the same
// arithmetic: 48's bits. MINB:
// CTAs of 256 threads per SM the registers are sized for (2: 128 registers). (Session 6's MODE 6, the int4 "zero-point mma", was removed after
// checkpoint A: slower at every shape; docs/notes/gemv4-s6.md.)
// KB: blocks per stage, 4 (every kernel until session 8) or 2 (variants 59 / 60, int4 g128: K split over the warps in
// units of 4 blocks, SU, so a warp decodes the KB = 4 kernel's blocks in its order; the zero points of a stage as the
// aligned 4-byte word around its 2 bytes, W4Layout's ZW).
// ORD (session 7, a storage-layout flag): each 32-bit word of codes holds weights 2p in nibble p and
// 2p + 1 in nibble p + 4 (p = 0..3) instead of weight i in nibble i, so a pair (p, p + 4) is the
// consecutive weights (2p, 2p + 1) and x's 32-bit words pair with it as loaded (no byte permutes).
// (Session 7's DEC 1 / 2, the zero point through x sums, variants 45-47 / 49 / 50, were removed in session 8:
// slower at every shape of session 7's final run; docs/notes/gemv4-s7.md.)
template <class T, class F, int KB, int D, int MODE = 0, bool NARROW = false, int MINB = 2, bool ORD = false>
__global__ void __launch_bounds__(256, MINB) k_w4(const QGemvArgs p) {
  using L = W4Layout<F, KB, NARROW>;
  // LEAN: wide meta copies with at most one zero-point unit per row (KB = 4)
  // IF (MODE 15, a ring of 2): the next stage's copies issued before the wait for this stage's bytes (LEAN's copies,
  // without LEAN's block-0 reads ahead of them: F0)
  constexpr bool PROBE = MODE == 1, LEAN = (MODE == 3 || MODE == 5 || MODE == 15) && !NARROW && L::NUZ <= 1,
                 XA = MODE == 5, NOX = MODE == 7, XS = MODE == 8 || MODE == 9 || (MODE >= 11 && MODE <= 15),
                 ROLL = MODE == 9 || MODE == 10, XP = MODE == 11 || MODE == 13 || MODE == 14 || MODE == 15,
                 XCA = XP || MODE == 12, XE = MODE == 13 || MODE == 14, XH = MODE == 14, IF = MODE == 15,
                 F0 = LEAN && !IF;
  static_assert(!XP || !ORD, "XP: codes in the natural order");
  static_assert(!IF || (D == 2 && !XE), "IF: a ring of 2 (groups: codes 0, x 0, then one per stage)");
  static_assert(!XH || (std::is_same_v<T, bf16> && !F::kNvf4 && F::G == 128 && KB == 4), "XH: int4 g128, bf16 x");
  // XH (session 9, variant 61): the stage's x as fp16 (times 2^e, e per warp and stage), the codes decoded as fp16
  using TC = std::conditional_t<XH, f16, T>;  // the mma's input type
  // XS (M = 1 only): x of each stage's blocks travels with the codes (cp.async, after the PDL wait)
  constexpr int XB = XS ? KB * 256 : 0, STG = L::STAGE + XB;
  constexpr int P = L::P, NK = KB / 2, NG = F::NG, LB = F::LB, WPG = F::WPG;
  constexpr uint32_t kMag = std::is_same_v<TC, bf16> ? 0x43004300u : 0x64006400u;  // 128.0 / 1024.0 twice
  static_assert(KB % 2 == 0 && KB >= 2, "an even number of blocks per stage");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  // SU: the unit of the split of K over the warps, in blocks: a stage (KB = 4); KB = 2 (session 8, int4 g128)
  // splits K in units of 4 blocks as the KB = 4 kernels do, so that a warp decodes the same blocks in the same
  // order: their bits. b0 is then a multiple of 4.
  constexpr int SU = KB < 4 ? 4 : KB;
  const int64_t nblk = p.k / 128, nst = (nblk + SU - 1) / SU;
  const int64_t parts = int64_t(gridDim.y) * nw, pi = int64_t(blockIdx.y) * nw + warp;
  const int64_t s0 = nst * pi / parts, s1 = nst * (pi + 1) / parts;  // the warp's split units
  const int64_t b0 = SU == KB ? s0 * KB : std::min(nblk, s0 * SU), b1 = std::min(nblk, s1 * SU);  // its blocks

  extern __shared__ uint4 smem[];
  const uint32_t ring = smem_addr(smem) + uint32_t(warp) * uint32_t(D * STG);
  // code copies: lane l takes chunks c = l % 8 + 8 k of rows l / 8 + 4 i of each stage
  const int ch = lane % 8, rr = lane / 8;
  const uint8_t* q = static_cast<const uint8_t*>(p.q);
  const uint8_t* qp[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + rr + 4 * i < p.n ? row0 + rr + 4 * i : p.n - 1;
    qp[i] = q + row * p.q_rs + b0 * 64 + ch * 16;
  }
  const uint32_t cd0 = uint32_t(rr * P + ((ch ^ w4_swz(rr)) * 16));      // rows rr + 4 i, i even
  const uint32_t cd1 = uint32_t((rr + 4) * P + ((ch ^ w4_swz(rr + 4)) * 16)) - uint32_t(4 * P);  // i odd
  // scale / zero-point copies: 16 rows x (SR / US) units, 16 rows x (ZR / UZ) units
  const uint8_t* sbase = F::kNvf4 ? p.zeros : reinterpret_cast<const uint8_t*>(p.scales);
  const int64_t srow = nblk * F::SB, zrow = nblk * F::ZB;  // bytes per row
  int64_t left = b1 - b0;  // blocks not yet issued
  int64_t bnext = b0;      // the next stage's first block
  // LEAN: the lane's scale / zero-point copies of a full stage (JS scale units, one zero unit
  // for lanes < 16 where the zero rows take one unit each): source and stage offset, once
  constexpr int NUS0 = L::SR / L::US, JS = (16 * NUS0 + 31) / 32;
  constexpr bool LZ = LEAN && F::ZB > 0;
  [[maybe_unused]] const uint8_t* lsrc[JS];
  [[maybe_unused]] uint32_t ldst[JS];
  [[maybe_unused]] const uint8_t* lzsrc = nullptr;
  [[maybe_unused]] uint32_t lzdst = 0;
  if constexpr (LEAN) {
#pragma unroll
    for (int j = 0; j < JS; ++j) {
      const int i = std::min(32 * j + lane, 16 * NUS0 - 1), r = i / NUS0, c = i % NUS0;
      const int64_t row = row0 + r < p.n ? row0 + r : p.n - 1;
      lsrc[j] = sbase + row * srow + b0 * F::SB + c * L::US;
      ldst[j] = uint32_t(L::CODES + r * L::SP + c * L::US);
    }
    if constexpr (LZ) {
      const int r = lane & 15;
      const int64_t row = row0 + r < p.n ? row0 + r : p.n - 1;
      lzsrc = p.zeros + row * zrow + b0 * F::ZB;
      lzdst = uint32_t(L::CODES + L::SCALES + r * L::ZP);
    }
  }
  // XS: the stage's x (row 0, KB * 128 elements). G = 128 / NVF4: 16-byte chunk c stored at
  // c ^ 2 (c >> 3 & 1), which makes the reads of the 4 lanes t (chunks w + 4 t) conflict-free;
  // G = 64 / 32 read chunks 2 t + .. / t + .. : conflict-free as they are.
  constexpr bool XSW = F::G == 128;
  [[maybe_unused]] bool xon = false;  // x copies allowed (after the PDL wait)
  [[maybe_unused]] const uint8_t* xsrc = static_cast<const uint8_t*>(p.x) + b0 * 256;
  auto issue_x = [&](uint32_t sb, const uint8_t* src, int64_t lft) {
    static_assert(KB * 16 % 32 == 0, "whole x chunks per lane");
#pragma unroll
    for (int j0 = 0; j0 < KB * 16; j0 += 32) {
      const int j = j0 + lane;
      if (lft >= KB || j < lft * 16) {
        const uint32_t d = sb + uint32_t(L::STAGE + 16 * (XSW ? j ^ (((j >> 3) & 1) << 1) : j));
        if constexpr (XCA) cp_async16_ca(d, src + 16 * j);  // through L1: the SM's other CTAs read the same x
        else cp_async16(d, src + 16 * j);
      }
    }
  };
  // XS: lane t's x offsets in a stage, words w with (w & 2) == 0 / != 0 (G = 128: chunk
  // w + 4 t, moved by +-2 chunks where t >= 2; else chunk .. + t G / 32)
  [[maybe_unused]] const uint32_t xsd = XSW && t >= 2 ? 32u : 0u;
  [[maybe_unused]] const uint32_t xs_p = uint32_t(L::STAGE + 16 * t * (F::G / 32)) + xsd;
  [[maybe_unused]] const uint32_t xs_m = uint32_t(L::STAGE + 16 * t * (F::G / 32)) - xsd;
  auto issue = [&](int st) {
    if (left > 0) {
      const uint32_t sb = ring + uint32_t(st * STG);
      const bool full = left >= KB;
      if constexpr (XS) {
        if (xon) {
          if (IF && full) issue_x(sb, xsrc, KB);  // MODE 15: a full stage's x without per-chunk predicates
          else issue_x(sb, xsrc, left);
        }
      }
      if (LEAN && full) {  // the same copies as below, from the precomputed addresses
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int k = 0; k < NK; ++k)
            cp_async16(sb + ((i & 1) ? cd1 : cd0) + uint32_t(4 * i * P + 128 * k), qp[i] + 128 * k);
#pragma unroll
        for (int j = 0; j < JS; ++j)
          if (32 * j + lane < 16 * NUS0) cp_async_u<L::US>(sb + ldst[j], lsrc[j]);
        if constexpr (LZ) {
          if (lane < 16) cp_async_u<L::UZ>(sb + lzdst, lzsrc);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int k = 0; k < NK; ++k)
            if (full || ch + 8 * k < left * 4)
              cp_async16(sb + ((i & 1) ? cd1 : cd0) + uint32_t(4 * i * P + 128 * k), qp[i] + 128 * k);
        const int vs = int(std::min<int64_t>(left, KB)) * F::SB;  // valid scale bytes per row
        constexpr int NUS = L::SR / L::US;
#pragma unroll
        for (int i0 = 0; i0 < 16 * NUS; i0 += 32) {
          const int i = i0 + lane;
          if (i < 16 * NUS) {
            const int r = i / NUS, c = i % NUS;
            const int64_t row = row0 + r < p.n ? row0 + r : p.n - 1;
            const int v = vs - c * L::US;
            if (v > 0)
              cp_async_z<L::US>(sb + uint32_t(L::CODES + r * L::SP + c * L::US),
                                sbase + row * srow + bnext * F::SB + c * L::US, v < L::US ? v : L::US);
          }
        }
        if constexpr (F::ZB > 0) {
          const int vz = int(std::min<int64_t>(left, KB)) * F::ZB;
          constexpr int NUZ = L::NUZ;
#pragma unroll
          for (int i0 = 0; i0 < 16 * NUZ; i0 += 32) {
            const int i = i0 + lane;
            if (i < 16 * NUZ) {
              const int r = i / NUZ, c = i % NUZ;
              const int64_t row = row0 + r < p.n ? row0 + r : p.n - 1;
              const uint8_t* src = p.zeros + row * zrow + bnext * F::ZB;
              int v = vz - c * L::UZ;
              if constexpr (L::ZW) {  // the aligned word of blocks bnext & ~3 .. + 3 (b0 % 4 == 0, nblk % 4 == 0)
                src = p.zeros + row * zrow + (bnext & ~int64_t(3));
                v = 4;
              }
              if constexpr (NARROW) {  // the aligned words around the row's bytes
                const int a = int(reinterpret_cast<uintptr_t>(src) & 3u);
                src -= a;
                v += a;
              }
              if (v > 0)
                cp_async_z<L::UZ>(sb + uint32_t(L::CODES + L::SCALES + r * L::ZP + c * L::UZ), src + c * L::UZ,
                                  v < L::UZ ? v : L::UZ);
            }
          }
        }
      }
    }
    cp_commit();
#pragma unroll
    for (int i = 0; i < 4; ++i) qp[i] += KB * 64;
    if constexpr (XS) xsrc += KB * 256;
    if constexpr (LEAN) {
#pragma unroll
      for (int j = 0; j < JS; ++j) lsrc[j] += KB * F::SB;
      if constexpr (LZ) lzsrc += KB * F::ZB;
    }
    left -= KB;
    bnext += KB;
  };

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc2[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // acc2: NVF4's k-steps B
  const int xrow = g < p.m ? g : int(p.m) - 1;
  const T* xr = static_cast<const T*>(p.x) + int64_t(xrow) * p.x_rs + b0 * 128 + t * (F::G / 4);

  pdl_trigger();
  if constexpr (XE) {  // stage 0's codes; after the PDL wait its x, then stages 1 .. D - 2 whole
    issue(0);
    pdl_wait();
    if (b1 - b0 > 0) issue_x(ring, static_cast<const uint8_t*>(p.x) + b0 * 256, b1 - b0);
    cp_commit();
    xon = true;
#pragma unroll
    for (int st = 1; st < D - 1; ++st) issue(st);
  } else {
#pragma unroll
    for (int st = 0; st < D - 1; ++st) issue(st);
    pdl_wait();
  }
  if constexpr (XS && !XE) {  // x of the stages issued before the PDL wait: one more group
#pragma unroll
    for (int st = 0; st < D - 1; ++st)
      if (b1 - b0 - int64_t(st) * KB > 0)
        issue_x(ring + uint32_t(st * STG), static_cast<const uint8_t*>(p.x) + (b0 + int64_t(st) * KB) * 256,
                b1 - b0 - int64_t(st) * KB);
    cp_commit();
    xon = true;
  }

  // fragment offsets in a stage (row g): piece h of block bb lies at chunk (4 bb + c_h) ^ sw,
  // i.e. 64 bb + 16 (c_h ^ (sw & 3)) + (bb odd ? -1 : 1) 16 (sw & 4) + the byte in the chunk
  const int sw = w4_swz(g);
  uint32_t fo[2][NG];
#pragma unroll
  for (int h = 0; h < NG; ++h) {
    const int off = h * (F::G / 2) + t * LB;
    const int base = g * P + 16 * ((off / 16) ^ (sw & 3)) + off % 16;
    fo[0][h] = uint32_t(base + 16 * (sw & 4));
    fo[1][h] = uint32_t(base - 16 * (sw & 4));
  }
  const uint32_t mag = w4_opaque(kMag);
  // NARROW: the misalignment of the zero-point rows g and g + 8 (the same in every stage)
  [[maybe_unused]] int za_off = 0, zb_off = 0;
  if constexpr (NARROW && F::ZB > 0) {
    const int64_t ra = row0 + g < p.n ? row0 + g : p.n - 1, rb2 = row0 + g + 8 < p.n ? row0 + g + 8 : p.n - 1;
    za_off = int(reinterpret_cast<uintptr_t>(p.zeros + ra * zrow + b0 * F::ZB) & 3u);
    zb_off = int(reinterpret_cast<uintptr_t>(p.zeros + rb2 * zrow + b0 * F::ZB) & 3u);
  }

  // x of block bb of the current stage, word w (8 elements at the lane's physical k)
  auto load_x = [&](uint4 (&xv)[4], int bb, [[maybe_unused]] uint32_t sb = 0) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      if constexpr (XS) {  // from the stage: chunk bb 16 + (the element offset) / 8, swizzled
        const int cw = ((w / WPG) * F::G + 8 * (w % WPG)) / 8;  // the word's chunk in the block (lane 0)
        xv[w] = lds16(sb + ((cw & 2) ? xs_m : xs_p) + uint32_t(256 * bb + 16 * cw));
      } else if constexpr (NOX) {  // the probe without x loads: opaque register values (wrong results)
        uint32_t v;
        asm volatile("mov.b32 %0, %1;" : "=r"(v) : "n"(0x3f803f80));
        xv[w] = make_uint4(v, v ^ uint32_t(bb), v, v ^ uint32_t(w));
      } else {
        xv[w] = __ldg(reinterpret_cast<const uint4*>(xr + bb * 128 + (w / WPG) * F::G + 8 * (w % WPG)));
      }
    }
  };
  // the shared reads of block bb of the stage at sb
  // zo (ZW): the byte of the stage's first block in its zero-point word (0 or 2)
  auto fetch = [&](uint32_t sb, int bb, [[maybe_unused]] uint32_t zo) {
    W4Frag f{};
    const uint32_t sca = sb + uint32_t(L::CODES + g * L::SP), scb = sca + uint32_t(8 * L::SP);
    [[maybe_unused]] const uint32_t zaa = sb + uint32_t(L::CODES + L::SCALES + g * L::ZP);
    [[maybe_unused]] const uint32_t zab = zaa + uint32_t(8 * L::ZP);
    // the rows' zero points of the block's groups (int4: NG bytes)
    if constexpr (NARROW && F::ZB > 0) {  // bytes za_off + bb ZB .. of the rows' words
      const uint32_t pa = uint32_t(za_off + bb * F::ZB), pb = uint32_t(zb_off + bb * F::ZB);
      f.za = __funnelshift_r(lds_u32(zaa + (pa & ~3u)), lds_u32(zaa + (pa & ~3u) + 4), 8 * (pa & 3u));
      f.zb = __funnelshift_r(lds_u32(zab + (pb & ~3u)), lds_u32(zab + (pb & ~3u) + 4), 8 * (pb & 3u));
    } else if constexpr (F::ZB == 4) f.za = lds_u32(zaa + 4 * bb), f.zb = lds_u32(zab + 4 * bb);
    else if constexpr (F::ZB == 2) f.za = lds_u16(zaa + 2 * bb), f.zb = lds_u16(zab + 2 * bb);
    else if constexpr (L::ZW) f.za = lds_u8(zaa + zo + uint32_t(bb)), f.zb = lds_u8(zab + zo + uint32_t(bb));
    else if constexpr (F::ZB == 1) f.za = lds_u8(zaa + bb), f.zb = lds_u8(zab + bb);
    // the lane's 4 words of rows g and g + 8 in this block (NG pieces of LB bytes)
    uint32_t a[4], b[4];
#pragma unroll
    for (int h = 0; h < NG; ++h) {
      const uint32_t ad = sb + uint32_t(64 * bb) + fo[bb & 1][h];
      const uint4 va = lds_n<LB>(ad), vb = lds_n<LB>(ad + uint32_t(8 * P));
#pragma unroll
      for (int w = 0; w < WPG; ++w) {
        a[h * WPG + w] = word(va, w);
        b[h * WPG + w] = word(vb, w);
      }
    }
    f.wa = make_uint4(a[0], a[1], a[2], a[3]);
    f.wb = make_uint4(b[0], b[1], b[2], b[3]);
    if constexpr (F::kNvf4) {  // the block scales 2t, 2t + 1 of rows g and g + 8 (bytes 8 bb + 2t, + 1)
      f.sva.x = lds_u16(sca + uint32_t(8 * bb + 2 * t));
      f.svb.x = lds_u16(scb + uint32_t(8 * bb + 2 * t));
    } else {  // the rows' scales of the block's groups
      f.sva = lds_n<4 * NG>(sca + uint32_t(bb * F::SB));
      f.svb = lds_n<4 * NG>(scb + uint32_t(bb * F::SB));
    }
    return f;
  };
  [[maybe_unused]] uint4 xnext[4];  // XA: x of the next stage's first block
  auto stage = [&](int st, int nb, auto full, bool more, [[maybe_unused]] bool first, [[maybe_unused]] uint32_t zo) {
    constexpr bool kFull = decltype(full)::value;
    // x of a block and of the next: [0] the stage's first block, loaded before waiting for its
    // weights (XA: earlier), [1] copied to [0] after each block (ptxas renames them in full
    // stages; alternating the two by block parity gave the same SASS there); XS: [0] read from
    // the stage at each block's start
    uint4 xbuf[2][4];
    if constexpr (XA) {
#pragma unroll
      for (int w = 0; w < 4; ++w) xbuf[0][w] = xnext[w];
    } else if constexpr (!PROBE && !XS) load_x(xbuf[0], 0);
    if constexpr (IF) {
      // the next stage's copies before the wait: their slot ((st + 1) % 2) held the previous stage, whose reads
      // end before this __syncwarp, so they need not wait for this stage's bytes; then this stage's groups (the
      // first stage: codes 0 and x 0) done, the one just issued in flight
      __syncwarp();
      issue((st + D - 1) % D);
      cp_wait<D - 1>();
    } else if constexpr (XS) {  // the first stage: also the x group issued after the PDL wait
      if (first) {
        if constexpr (XE) cp_wait<D - 2>();  // groups: codes 0, x 0, stages 1 .. D - 2: the first two done
        else cp_wait<0>();
      } else {
        cp_wait<D - 2>();
      }
    } else {
      cp_wait<D - 2>();
    }
    __syncwarp();
    const uint32_t sb = ring + uint32_t(st * STG);
    [[maybe_unused]] float xinv = 1.0f;  // XH: 2^-e, the stage's x scale undone on the group scales
    if constexpr (XH) {  // x to fp16 x 2^e, paired in place (w4_xhalf)
      xinv = w4_xhalf<XB / 16 / 32>(sb + uint32_t(L::STAGE), lane);
      __syncwarp();
    } else if constexpr (XP) {  // pair the stage's x in place (every lane g reads the same x at M = 1): once per stage
#pragma unroll
      for (int j = 0; j < XB / 16; j += 32) {
        const uint32_t a = sb + uint32_t(L::STAGE + 16 * (j + lane));
        uint4 v = lds16(a), o;
        w4_xpairs<false>(v, o.x, o.y, o.z, o.w);
        sts16(a, o);
      }
      __syncwarp();
    }
    [[maybe_unused]] W4Frag f0{};
    if constexpr (F0) f0 = fetch(sb, 0, zo);  // LEAN: block 0's reads before the copies are issued
    if constexpr (!IF) issue((st + D - 1) % D);
#pragma unroll
    for (int bb = 0; bb < KB; ++bb) {
      if (!kFull && bb >= nb) break;
      const W4Frag f = [&] {
        if constexpr (F0)
          if (bb == 0) return f0;
        return fetch(sb, bb, zo);
      }();
      [[maybe_unused]] const uint32_t za = f.za, zb = f.zb;
      const uint4 wa = f.wa, wb = f.wb;
      if constexpr (PROBE) {
        const uint32_t v = wa.x ^ wa.y ^ wa.z ^ wa.w ^ wb.x ^ wb.y ^ wb.z ^ wb.w ^ za ^ f.sva.x;
        acc[0] += __uint_as_float(v & 0x007fffffu);
        continue;
      }
      uint4(&xc)[4] = xbuf[0];
      [[maybe_unused]] uint4(&xn)[4] = xbuf[1];  // the next block's x, loaded ahead
      if constexpr (XS) load_x(xc, bb, sb);
      else if (bb + 1 < KB && (kFull || bb + 1 < nb)) load_x(xn, bb + 1);
      if constexpr (XA && kFull)
        if (bb + 1 == KB && more) load_x(xnext, KB);  // the next stage's first block (xr moves by KB blocks)
      if constexpr (F::kNvf4) {
        // the block scales 2t, 2t + 1 of rows g and g + 8 (bytes 8 bb + 2t, + 1)
        uint32_t sa[2], sbb[2];
        w4_nvf_scales<T>(f.sva.x, sa[0], sa[1]);
        w4_nvf_scales<T>(f.svb.x, sbb[0], sbb[1]);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const uint4 xv = xc[w];
          uint32_t bA0, bA1, bB0, bB1;
          w4_xpairs<ORD || XP>(xv, bA0, bA1, bB0, bB1);
          uint32_t pr[2][4];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const uint32_t u = word(r ? wb : wa, w), s2 = r ? sbb[w >> 1] : sa[w >> 1];
            pr[r][0] = w4_nvf_pair<T, 0>(u, s2);
            pr[r][1] = w4_nvf_pair<T, 1>(u, s2);
            pr[r][2] = w4_nvf_pair<T, 2>(u, s2);
            pr[r][3] = w4_nvf_pair<T, 3>(u, s2);
          }
          const uint32_t aA[4] = {pr[0][0], pr[1][0], pr[0][1], pr[1][1]};
          const uint32_t aB[4] = {pr[0][2], pr[1][2], pr[0][3], pr[1][3]};
          mma16816<T>(acc, aA, bA0, bA1);
          mma16816<T>(acc2, aB, bB0, bB1);
        }
      } else {
        const uint4 sva = f.sva, svb = f.svb;
        constexpr bool TWO = WPG >= 2;  // two mma chains (k-steps A / B) per group
#pragma unroll
        for (int h = 0; h < NG; ++h) {
          // bytes [z, magic high byte, z, magic high byte]: (magic + z) twice
          const uint32_t sel = uint32_t(h) | (5u << 4) | (uint32_t(h) << 8) | (5u << 12);
          const uint32_t z2a = __byte_perm(za, mag, sel), z2b = __byte_perm(zb, mag, sel);
          // XH: -(64 + z) twice (fp16: 64 + z = 0x5400 + 16 z), for the odd nibbles' fma
          [[maybe_unused]] uint32_t n2a = 0, n2b = 0;
          if constexpr (XH) n2a = w4_negz16(z2a), n2b = w4_negz16(z2b);
          float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          [[maybe_unused]] float c2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int w = 0; w < WPG; ++w) {
            // the B registers of the word's two k-steps: x paired (natural order), as loaded (ORD / XP)
            uint32_t bx[4];
            w4_xpairs<ORD || XP>(xc[h * WPG + w], bx[0], bx[1], bx[2], bx[3]);
            const uint32_t ua = word(wa, h * WPG + w), ub = word(wb, h * WPG + w);
            uint32_t pa[4], pb[4];
            if constexpr (XH) {  // fp16: nibbles 1 / 5 (3 / 7) in place, times 1/16 in the fma; one shift per word
              w4_half_pairs(ua, mag, z2a, n2a, pa);
              w4_half_pairs(ub, mag, z2b, n2b, pb);
            } else {
#pragma unroll
              for (int qq = 0; qq < 4; ++qq) {
                pa[qq] = hsub2u<T>(w4_lop(w4_shift4(ua, qq), mag), z2a);
                pb[qq] = hsub2u<T>(w4_lop(w4_shift4(ub, qq), mag), z2b);
              }
            }
            const uint32_t aA[4] = {pa[0], pb[0], pa[1], pb[1]};
            const uint32_t aB[4] = {pa[2], pb[2], pa[3], pb[3]};
            mma16816<TC>(c, aA, bx[0], bx[1]);
            if constexpr (TWO) mma16816<TC>(c2, aB, bx[2], bx[3]);
            else mma16816<TC>(c, aB, bx[2], bx[3]);
          }
          float s_a = __uint_as_float(word(sva, h)), s_b = __uint_as_float(word(svb, h));
          if constexpr (XH) s_a *= xinv, s_b *= xinv;  // exact (a power of two; normal results)
          if constexpr (TWO) {
#pragma unroll
            for (int e = 0; e < 4; ++e) c[e] += c2[e];
          }
          acc[0] = fmaf(s_a, c[0], acc[0]);
          acc[1] = fmaf(s_a, c[1], acc[1]);
          acc[2] = fmaf(s_b, c[2], acc[2]);
          acc[3] = fmaf(s_b, c[3], acc[3]);
        }
      }
      if constexpr (!XS) {
#pragma unroll
        for (int w = 0; w < 4; ++w) xc[w] = xn[w];
      }
    }
    xr += KB * 128;
  };

  const int64_t nstw = SU == KB ? s1 - s0 : (b1 - b0 + KB - 1) / KB;  // the warp's stages
  // ZW: stage j's first block b0 + 2 j lies at byte 2 (j & 1) of its zero-point word (b0 % 4 == 0)
  const auto zofs = [](int64_t j) { return L::ZW ? uint32_t(2 * (j & 1)) : 0u; };
  if constexpr (XA)
    if (nstw > 0) load_x(xnext, 0);  // after pdl_wait: x may be the previous kernel's output
  if constexpr (ROLL) {  // one stage body (and one partial) instead of D: less code
    int st = 0;
#pragma unroll 1
    for (int64_t j = 0; j < nstw; ++j) {
      const int64_t nbl = b1 - b0 - j * KB;
      if (nbl >= KB) stage(st, KB, std::true_type{}, j + 1 < nstw, j == 0, zofs(j));
      else stage(st, int(nbl), std::false_type{}, false, j == 0, zofs(j));
      st = st + 1 == D ? 0 : st + 1;
    }
  } else {
    for (int64_t j0 = 0; j0 < nstw; j0 += D) {
#pragma unroll
      for (int st = 0; st < D; ++st) {
        const int64_t j = j0 + st;
        if (j < nstw) {
          const int64_t nbl = b1 - b0 - j * KB;
          if (nbl >= KB) stage(st, KB, std::true_type{}, j + 1 < nstw, j == 0, zofs(j));
          else stage(st, int(nbl), std::false_type{}, false, j == 0, zofs(j));
        } else {
          issue((st + D - 1) % D);  // keeps the group count uniform (empty groups)
        }
      }
    }
  }
  cp_wait<0>();
  if constexpr (F::kNvf4) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] += acc2[e];
  }

  // the warps' sums, added in warp order (through the ring memory, free now)
  float* red = reinterpret_cast<float*>(smem);  // [nw][32][4]
  cta_sums4_put(red, acc, warp, lane, nw);
  if (warp != 0) return;
  const int S = gridDim.y, sl = blockIdx.y;
  float rs = 1.0f;
  if constexpr (F::kNvf4) rs = W4NvfBits<T>::kRowScale * __ldg(p.tensor_scale);
  float4 ws = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (nw > 1) ws = warps_sum4(red + lane * 4, 32 * 4, nw);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float v = acc[e];
    if (nw > 1) v = f4_get(ws, e);
    const int m = 2 * t + (e & 1);
    const int64_t row = row0 + g + (e >= 2 ? 8 : 0);
    if (m < p.m && row < p.n) {
      if constexpr (F::kNvf4) v *= rs;
      if (S == 1) store_out(p.y, p.out_dtype, m * p.n + row, v);
      else p.part[(int64_t(sl) * p.m + m) * p.n + row] = v;
    }
  }
}

}  // namespace gk::cuda::gemv_detail
