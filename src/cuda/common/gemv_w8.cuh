// Decode GEMV on the tensor cores with warp-staged, coalesced weight tiles ("staged"
// kernel, src/cuda/gemv_w8.cu): bf16/fp16 weights at M = 1..8, fp8-e4m3 and int8 weights
// with a scale per row (W8A16). y[m, j] = sum_k x[m, k] * w[j, k], M <= 8.
//
// Plan (the weight read is the whole cost, so every weight byte is read once, in long
// coalesced runs, with several stages in flight per warp, and decoded with ~0.5-1
// instructions per weight):
// - a CTA owns 16 RT weight rows (RT m16 tiles of mma.m16n8k16) and nw warps (1..8, a function of
//   N and K only); warp w sweeps its own contiguous part of K (of its split-K slice) in
//   stages of 16 RT rows x KB 64-byte blocks, copied global -> shared memory with cp.async by
//   the warp's lanes (each warp instruction copies 4 rows x 128 contiguous bytes), into
//   a ring of D stages per warp (D - 1 stages in flight while one is decoded; only
//   __syncwarp, no CTA barrier in the loop). The 16-byte chunks of odd rows are
//   XOR-swizzled by 4 so the fragment reads below are free of bank conflicts.
// - lane (g, t) reads chunk t of each 64-byte block of rows g and g + 8 (one 16-byte shared
//   load each) and turns it into mma A pairs; the quad's 4 chunks are the k-steps of the
//   block: chunk word s (8-bit) / words 2s, 2s+1 (16-bit) are k-step s. The B operand (x
//   row m = g, zeros for g >= M) is loaded from global memory (read-only path, L1) with the
//   same physical k order, so the logical k order inside a k-step is a permutation that A
//   and B share.
// - operand types: bf16/fp16 weights are the mma operands as loaded (x in the weight dtype);
//   fp8 and int8 weights become exact fp16 (cvt.rn.f16x2.e4m3x2; int8 by a byte permute
//   under fp16's 1024 exponent and one packed subtraction) and B is fp16: fp16 x as it is,
//   bf16 x through a small first kernel (k_w8_xprep) that writes x[m] * 2^c_m in fp16
//   with c_m chosen from the row's largest |x| (that value lands in [2^14, 2^15), every
//   value down to 2^-31 of it is exact) and 2^-c_m, applied to the fp32 sums at the end.
// - fp32 accumulation in two interleaved accumulators (even / odd k-steps), added at the
//   end; the warps' sums are added in warp order; the row scale multiplies the sum. A
//   split-K (small N only; a function of N, K and the weight width, never of M) writes
//   fp32 slices that k_gemv_sum adds in slice order. No atomics: the same bits every run,
//   and a row of x gives the same bits alone or in a batch.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "gemv_mma.cuh"

namespace gk::cuda::gemv_detail {

// Shared bytes of one stage of the ring (16 RT rows of KB 64-byte blocks).
constexpr int w8_stage_bytes(int kb, int rt) { return 16 * rt * kb * 64; }

// ---- weight formats of the staged kernel ----
// EB: bytes per weight; TB: the mma operand type; kSteps: k16-steps per 16-byte chunk;
// a(w, s, lo, hi): the A pairs of k-step s of chunk w (lo: logical k 2t, 2t + 1; hi: 2t + 8,
// 2t + 9); kScaled: a row scale in p.scales.
template <class T>
struct SDense {  // bf16 / fp16 weights
  using TB = T;
  static constexpr int EB = 2, kSteps = 2;
  static constexpr bool kScaled = false;
  __device__ static void a(const uint4& w, int s, uint32_t& lo, uint32_t& hi) {
    lo = word(w, 2 * s);
    hi = word(w, 2 * s + 1);
  }
};

__device__ __forceinline__ uint32_t e4m3x2_to_h2(uint32_t u16) {
  __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(u16 & 0xffffu), __NV_E4M3);
  return uint32_t(r.x) | (uint32_t(r.y) << 16);
}

// Both e4m3 pairs of a word (bytes 0-1 and 2-3) as fp16 pairs, the halves split by a move.
__device__ __forceinline__ void e4m3x4_to_h2x2(uint32_t u, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(u));
}

struct SFp8 {  // e4m3 codes, exact in fp16
  using TB = f16;
  static constexpr int EB = 1, kSteps = 4;
  static constexpr bool kScaled = true;
  __device__ static void a(const uint4& w, int s, uint32_t& lo, uint32_t& hi) { e4m3x4_to_h2x2(word(w, s), lo, hi); }
};

struct SInt8 {  // int8 codes: (1024 + 128 + q) - 1152 in fp16, exact
  using TB = f16;
  static constexpr int EB = 1, kSteps = 4;
  static constexpr bool kScaled = true;
  __device__ static void a(const uint4& w, int s, uint32_t& lo, uint32_t& hi) {
    const uint32_t u = word(w, s) ^ 0x80808080u;
    lo = hsub2u<f16>(__byte_perm(u, 0x64646464u, 0x4140u), 0x64806480u);
    hi = hsub2u<f16>(__byte_perm(u, 0x64646464u, 0x4342u), 0x64806480u);
  }
};

// ---- 8-bit weights as exact bf16 (bf16 x used as it is: no fp16 copy of x, no x kernel) ----
// e4m3 bytes b0..b3 of u as bf16 pairs lo = (b0, b1), hi = (b2, b3), exactly. One byte permute
// puts b1 in byte 3, b0 in byte 1 and b0's sign replicated in byte 2; an arithmetic shift by 4
// then leaves each half as [sign | 0000 eeee | mmm 0000] (plus copies of the signs that the mask
// removes): the bf16 of the e4m3 value times 2^-120 (e4m3 subnormals become bf16 subnormals,
// the same bits scaled); the packed bf16 multiply by 2^120 (exact: a power of two, no overflow,
// subnormal inputs supported) gives the value itself. 4 instructions per pair (cvt to fp16: 1).
// NaN codes (0x7f, 0xff) become +-480 here (the fp16 path and the CPU give NaN).
__device__ __forceinline__ uint32_t e4m3x2_bf2(uint32_t u, uint32_t sel) {
  uint32_t v;  // prmt itself: __byte_perm ignores the selectors' sign-replication bit (H200, A)
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(v) : "r"(u), "r"(0u), "r"(sel));
  const uint32_t r = uint32_t(int32_t(v) >> 4) & 0x87f087f0u;
  return hmul2u<bf16>(r, 0x7b807b80u);  // 2^120 twice
}
__device__ __forceinline__ void e4m3x4_to_bf2x2(uint32_t u, uint32_t& lo, uint32_t& hi) {
  lo = e4m3x2_bf2(u, 0x1804u);  // bytes: 0, b0, sign(b0), b1
  hi = e4m3x2_bf2(u, 0x3a24u);  // bytes: 0, b2, sign(b2), b3
}
// int8 bytes as bf16 pairs, exactly: q = low7 - 128 s = (128 + low7) - (128 + 128 s), both
// terms bf16 patterns under the exponent byte 0x43 (0x43 | low7 is 128 + low7; 0x4300 | s << 7
// is 128 or 256), one packed bf16 subtraction (exact: the result has at most 8 bits).
__device__ __forceinline__ uint32_t i8x2_bf2(uint32_t u, uint32_t sel) {
  const uint32_t v = __byte_perm(u, 0x43434343u, sel);
  return hsub2u<bf16>(v & 0xff7fff7fu, v & 0xff80ff80u);
}

struct SFp8B {  // e4m3 codes as exact bf16, B = bf16 x as it is
  using TB = bf16;
  static constexpr int EB = 1, kSteps = 4;
  static constexpr bool kScaled = true;
  __device__ static void a(const uint4& w, int s, uint32_t& lo, uint32_t& hi) { e4m3x4_to_bf2x2(word(w, s), lo, hi); }
};

struct SInt8B {  // int8 codes as exact bf16, B = bf16 x as it is
  using TB = bf16;
  static constexpr int EB = 1, kSteps = 4;
  static constexpr bool kScaled = true;
  __device__ static void a(const uint4& w, int s, uint32_t& lo, uint32_t& hi) {
    const uint32_t u = word(w, s);
    lo = i8x2_bf2(u, 0x4140u);
    hi = i8x2_bf2(u, 0x4342u);
  }
};

// The power of two c of a row of bf16 x whose largest |x| has the bits mx (sign cleared):
// max * 2^c in [2^14, 2^15); 0 for a zero, inf or NaN maximum; within [-126, 126].
__device__ __forceinline__ int w8_exponent(uint32_t mx) {
  if (mx == 0 || mx >= 0x7f80u) return 0;
  const int c = 14 - ilogbf(__uint_as_float(mx << 16));
  return c < -126 ? -126 : (c > 126 ? 126 : c);
}
// Two bf16 values (one word) times sc as an fp16 pair, rounded to nearest.
__device__ __forceinline__ uint32_t w8_scale_h2(uint32_t u, float sc) {
  __half2 h = __floats2half2_rn(__uint_as_float(u << 16) * sc, __uint_as_float(u & 0xffff0000u) * sc);
  return *reinterpret_cast<uint32_t*>(&h);
}

// XS kernels: the CTA makes the scaled fp16 copy of bf16 x itself (the same values and
// scales as k_w8_xprep, so the same bits): the largest |x| of each row over all of K,
// then elements [e0, e1) of each row into shared memory at xs (rows `pitch` bytes apart);
// xinv_s[m] = 2^-c_m.
__device__ __forceinline__ void w8_stage_x(const KArgs& p, int64_t e0, int64_t e1, uint32_t xs, int pitch,
                                           float* xinv_s) {
  __shared__ uint32_t mx_s[8][8];
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
  const bf16* x = static_cast<const bf16*>(p.x);
  const int64_t nv = p.k / 8;
  for (int m = 0; m < p.m; ++m) {
    const uint4* xr = reinterpret_cast<const uint4*>(x + m * p.x_rs);
    uint32_t mx = 0;
    for (int64_t i = tid; i < nv; i += nt) {
      const uint4 v = __ldg(xr + i);
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint32_t u = word(v, w);
        mx = max(mx, max(u & 0x7fffu, (u >> 16) & 0x7fffu));
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) mx_s[warp][m] = mx;
  }
  __syncthreads();
  const int64_t per = (e1 - e0) / 8;
  for (int64_t i = tid; i < int64_t(p.m) * per; i += nt) {
    const int m = int(i / per);
    const int64_t j = i % per;
    uint32_t mx = mx_s[0][m];
    for (int w = 1; w < nw; ++w) mx = max(mx, mx_s[w][m]);
    const float sc = __uint_as_float(uint32_t(w8_exponent(mx) + 127) << 23);
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(x + m * p.x_rs + e0) + j);
    uint32_t o[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) o[w] = w8_scale_h2(word(v, w), sc);
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(xs + uint32_t(m * pitch) + uint32_t(j * 16)),
                 "r"(o[0]), "r"(o[1]), "r"(o[2]), "r"(o[3]));
  }
  if (tid < p.m) {
    uint32_t mx = mx_s[0][tid];
    for (int w = 1; w < nw; ++w) mx = max(mx, mx_s[w][tid]);
    xinv_s[tid] = __uint_as_float(uint32_t(127 - w8_exponent(mx)) << 23);
  }
  __syncthreads();
}

// KArgs use: x = the B operand source [m, k] in F::TB (x_rs elements apart, 16-byte
// aligned rows), gscale = 2^-c per row of x or nullptr, scales = row scales (fp8/int8).
// A lane's accumulator e (column 2t + (e & 1)) of one row tile: the two k-step halves added,
// times the warp's 2^-c of that row of x when XR.
template <bool XR>
__device__ __forceinline__ float w8_warp_sum(const float (&a)[2][4], int e, const float* xinv, int t, int64_t m) {
  const float v = a[0][e] + a[1][e];
  if constexpr (XR) {
    const int col = 2 * t + (e & 1);
    return col < m ? v * xinv[col] : v;
  }
  return v;
}

// Row pitch (bytes) of a warp's x ring (XM 2): one stage of KB blocks of fp16 x, padded.
constexpr int w8_xring_pitch(int kb) { return kb * 128 + 16; }

// XM: where B comes from. 0: global memory (fp16 x, the x kernel's copy, or bf16/fp16 x of
// 16-bit weights); 1: the CTA's copy of bf16 x in shared memory (w8_stage_x); 2: bf16 x
// converted stage by stage by each warp into a small ring in shared memory, scaled by 2^c
// with c from the largest |x| of the row over the warp's own k range (the warp's sums are
// multiplied by 2^-c before the warps are added).
// XP (XM 0 only): the B operands of the next stage are loaded one stage ahead (registers), so
// the x load's latency is not on a warp's path from one stage to the next.
// The row scales (and the x kernel's 2^-c) are loaded at the start, not after the last stage.
// p.group (unused otherwise by this kernel; 0 by default): PF + 256 PD, PF stages per row
// prefetched into L2 before the wait, PD how many stages ahead of each cp.async stage an L2
// prefetch runs in the loop (0: none).
// FR (full ring; XM 0, no XP, p.group 0): the ring holds all of a warp's stages (the launch
// guarantees ceil((b1 - b0) / KB) <= D for every warp), so the prologue issues all D stages
// before the PDL wait and the loop issues none (an empty group per stage keeps the count:
// at stage j, D + j groups committed, the D - 1 newest may be pending). The same arithmetic
// in the same order as without: the same bits.
// ST (session 11, a diagnostic; gemv_w8_stamps_start): thread 0 of each CTA of the first kW8StampCtas
// writes %globaltimer stamps to p.aux (uint64 [CTA][8]): 0 entry, 1 the prologue's copies issued,
// 2 the PDL wait returned, 3 the first stage landed, 4 the loop left, 5 the warps' sums added,
// 6 the outputs stored, 7 %smid. The same arithmetic: the bits of !ST.
constexpr int kW8StampCtas = 2048;
__device__ __forceinline__ uint64_t w8_globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <class F, int KB, int D, int RT, int XM = 0, bool XP = false, bool FR = false, bool ST = false>
__global__ void __launch_bounds__(256, 2) k_w8(const KArgs p) {
  uint64_t* stp = nullptr;  // ST: this CTA's 8 stamps (nullptr past kW8StampCtas CTAs)
  if constexpr (ST) {
    const int64_t cta = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
    if (threadIdx.x == 0 && cta < kW8StampCtas) stp = reinterpret_cast<uint64_t*>(const_cast<uint8_t*>(p.aux)) + cta * 8;
  }
  auto stamp = [&](int i) {
    if constexpr (ST)
      if (stp) stp[i] = w8_globaltimer();
  };
  stamp(0);
  constexpr bool XS = XM == 1, XR = XM == 2;
  using TB = typename F::TB;
  constexpr int NR = 4 * RT;               // rows per lane in the copies (4 rows x 128 bytes per warp instruction)
  constexpr int NK = KB / 2;                // 16-byte copies per lane and row per stage
  constexpr int P = KB * 64;                // shared row pitch (chunks XOR-swizzled by row parity)
  constexpr int SB = 16 * RT * P;           // bytes per stage
  constexpr int XW = 16 / (F::EB * 8);      // 16-byte x loads per chunk (8-bit: 2, 16-bit: 1)
  constexpr int XE = 16 / F::EB;            // x elements per chunk
  constexpr int XB = 64 / F::EB;            // x elements per 64-byte block
  static_assert((RT == 1 || RT == 2) && KB % 2 == 0, "one or two row tiles, an even number of blocks");
  static_assert(XM == 0 || F::EB == 1, "XS / XR: 8-bit weights (fp16 B made from bf16 x)");
  static_assert(!XR || KB == 4, "XR: one 8-element x chunk per lane and row per stage");
  static_assert(!XP || XM == 0, "XP: B from global memory");
  static_assert(!FR || (XM == 0 && !XP), "FR: B from global memory, loaded per stage");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16 * RT;
  const int64_t nblk = p.k * F::EB / 64;
  const int64_t parts = int64_t(gridDim.y) * nw, pi = int64_t(blockIdx.y) * nw + warp;
  const int64_t b0 = nblk * pi / parts, b1 = nblk * (pi + 1) / parts;

  extern __shared__ uint4 smem[];
  const uint32_t ring = smem_addr(smem) + uint32_t(warp) * uint32_t(D * SB);
  // copies: lane l takes chunks c = l % 8 + 8 k of rows l / 8 + 4 i of each stage
  const int ch = lane % 8, rr = lane / 8;
  const uint8_t* qp[NR];  // the next stage's chunk of each of the lane's rows
#pragma unroll
  for (int i = 0; i < NR; ++i) {
    const int64_t row = row0 + rr + 4 * i < p.n ? row0 + rr + 4 * i : p.n - 1;
    qp[i] = p.q + row * p.q_rs + b0 * 64 + ch * 16;
  }
  // 16-byte chunk c of row r is stored at chunk c ^ 4 (r & 1): the fragment reads of rows g
  // and g + 1 fall in different halves of the 128-byte bank window (no conflicts)
  const uint32_t cdst = ring + uint32_t(rr * P + (ch ^ ((rr & 1) << 2)) * 16);
  int64_t left = b1 - b0;  // blocks not yet issued
  // PD > 0 (the knob's; p.group >> 8): each issue also prefetches the stage PD stages ahead of it
  // into L2 (lane r < 16 RT: its row r, one bulk prefetch), so more bytes are requested from
  // memory than the ring holds
  const int pd = int(p.group >> 8), pf = int(p.group & 0xff);
  const uint8_t* pfrow = p.q + (row0 + lane < p.n ? row0 + lane : p.n - 1) * p.q_rs;
  auto issue = [&](int st) {
    if (pd > 0 && lane < 16 * RT) {
      const int64_t off = b1 - left + int64_t(pd) * KB;
      if (off < b1)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(pfrow + off * 64),
                     "r"(uint32_t(min(int64_t(KB), b1 - off) * 64))
                     : "memory");
    }
    if (left >= KB) {
#pragma unroll
      for (int i = 0; i < NR; ++i)
#pragma unroll
        for (int k = 0; k < NK; ++k) cp_async16(cdst + uint32_t(st * SB + 4 * i * P + 128 * k), qp[i] + 128 * k);
    } else if (left > 0) {
#pragma unroll
      for (int i = 0; i < NR; ++i)
#pragma unroll
        for (int k = 0; k < NK; ++k)
          if (ch + 8 * k < left * 4) cp_async16(cdst + uint32_t(st * SB + 4 * i * P + 128 * k), qp[i] + 128 * k);
    }
    cp_commit();
#pragma unroll
    for (int i = 0; i < NR; ++i) qp[i] += KB * 64;
    left -= KB;
  };

  float acc[RT][2][4];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[rt][0][e] = acc[rt][1][e] = 0.0f;
  const bool xrow = g < p.m;
  const TB* xr = static_cast<const TB*>(p.x) + (xrow ? g : 0) * p.x_rs + t * XE + b0 * XB;  // the next stage's x

  // the row scales of the lane's output rows (weights: never written by a kernel, so read
  // before waiting for the previous kernel, like the first stages)
  float rsc[RT][2];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      rsc[rt][h] = 1.0f;
      if constexpr (F::kScaled) {
        const int64_t row = row0 + 16 * rt + g + 8 * h;
        rsc[rt][h] = __ldg(p.scales + (row < p.n ? row : p.n - 1));
      }
    }

  pdl_trigger();
#pragma unroll
  for (int st = 0; st < (FR ? D : D - 1); ++st) issue(st);
  // PF > 0 (the knob's; p.group & 255): the next PF stages of each row prefetched into L2 before
  // the wait as well (one bulk prefetch per row), so that more than the ring is requested
  // while the previous kernel finishes
  if (pf > 0 && lane < 16 * RT) {
    const int64_t off = (b0 + int64_t(D - 1) * KB) * 64, end = min(b1 * 64, off + pf * int64_t(KB) * 64);
    if (end > off)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(pfrow + off), "r"(uint32_t(end - off)) : "memory");
  }
  stamp(1);
  pdl_wait();
  stamp(2);
  [[maybe_unused]] bool first = true;  // ST: stamp 3 at the first stage
  float xg[2] = {1.0f, 1.0f};  // 2^-c of the lane's columns 2t, 2t + 1 (the x kernel's; read after the wait)
  if constexpr (!XS && !XR) {
#pragma unroll
    for (int e = 0; e < 2; ++e) xg[e] = (p.gscale && 2 * t + e < p.m) ? __ldg(p.gscale + 2 * t + e) : 1.0f;
  }
  // XP: the first stage's x
  uint4 xq[KB][XW];
  int64_t xnb = b1 - b0;  // blocks of x from xr on
  if constexpr (XP) {
#pragma unroll
    for (int bb = 0; bb < KB; ++bb)
#pragma unroll
      for (int i = 0; i < XW; ++i)
        xq[bb][i] = (xrow && bb < xnb) ? __ldg(reinterpret_cast<const uint4*>(xr + bb * XB + 8 * i)) : make_uint4(0, 0, 0, 0);
  }
  // XS: B from the CTA's scaled fp16 copy of its k range of x in shared memory
  __shared__ float xinv_s[8];
  uint32_t xsb = 0;
  if constexpr (XS) {
    const int64_t cb0 = nblk * (int64_t(blockIdx.y) * nw) / parts;
    const int64_t cb1 = nblk * (int64_t(blockIdx.y) * nw + nw) / parts;
    const int pitch = int((cb1 - cb0) * XB * 2 + 16);
    const uint32_t xs = smem_addr(smem) + uint32_t(nw * D * SB);
    w8_stage_x(p, cb0 * XB, cb1 * XB, xs, pitch, xinv_s);
    xsb = xs + uint32_t(g * pitch + t * XE * 2) + uint32_t((b0 - cb0) * XB * 2);
  }
  // XR: the warp's scales from its k range, its x ring, and the first stage's x in registers
  constexpr int XRP = w8_xring_pitch(KB);
  __shared__ float xinv_w[8][8];
  float xsc[8];
  uint4 xn[8];
  const bf16* xb = static_cast<const bf16*>(p.x);
  const uint32_t xring = smem_addr(smem) + uint32_t(nw * D * SB) + uint32_t(warp * D * p.m * XRP);
  int64_t xnext = b0 * 64;  // the element of the next stage's x
  if constexpr (XR) {
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      uint32_t mx = 0;
      if (m < p.m) {
        const uint4* xm = reinterpret_cast<const uint4*>(xb + m * p.x_rs + b0 * 64);
        for (int64_t i = lane; i < (b1 - b0) * 8; i += 32) {
          const uint4 v = __ldg(xm + i);
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const uint32_t u = word(v, w);
            mx = max(mx, max(u & 0x7fffu, (u >> 16) & 0x7fffu));
          }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      }
      const int c = w8_exponent(mx);
      xsc[m] = __uint_as_float(uint32_t(c + 127) << 23);
      if (lane == 0) xinv_w[warp][m] = __uint_as_float(uint32_t(127 - c) << 23);
      xn[m] = make_uint4(0, 0, 0, 0);
      if (m < p.m && lane < (b1 - b0) * 8) xn[m] = __ldg(reinterpret_cast<const uint4*>(xb + m * p.x_rs + xnext) + lane);
    }
    xnext += KB * 64;
    xsb = xring + uint32_t(g * XRP + t * XE * 2);
  }
  // fragment rows g (+ 8 + 16 rt) of a stage: chunk 4 bb + t of row g lies at block bb ^ (g & 1)
  const uint32_t fa_even = uint32_t(g * P + 16 * t + 64 * (g & 1)), fa_odd = uint32_t(g * P + 16 * t - 64 * (g & 1));

  // one stage: x operands, wait for the stage's weights, issue the stage D - 1 ahead, mma
  auto stage = [&](int st, int nb, auto full) {
    constexpr bool kFull = decltype(full)::value;
    if constexpr (XR) {  // this stage's x (in xn) scaled into slot st of the x ring; the next stage's x
      const uint32_t xs = xring + uint32_t(st * p.m * XRP + lane * 16);
#pragma unroll
      for (int m = 0; m < 8; ++m) {
        if (m < p.m) {
          const uint4 v = xn[m];
          asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(xs + uint32_t(m * XRP)),
                       "r"(w8_scale_h2(v.x, xsc[m])), "r"(w8_scale_h2(v.y, xsc[m])), "r"(w8_scale_h2(v.z, xsc[m])),
                       "r"(w8_scale_h2(v.w, xsc[m])));
          xn[m] = make_uint4(0, 0, 0, 0);
          if (xnext + 8 * lane < b1 * 64) xn[m] = __ldg(reinterpret_cast<const uint4*>(xb + m * p.x_rs + xnext) + lane);
        }
      }
      xnext += KB * 64;
      __syncwarp();
    }
    uint4 xv[KB][XW];
    if constexpr (XP) {  // this stage's x from the registers; the next stage's x loaded
#pragma unroll
      for (int bb = 0; bb < KB; ++bb)
#pragma unroll
        for (int i = 0; i < XW; ++i) xv[bb][i] = xq[bb][i];
      xnb -= KB;
      xr += KB * XB;
#pragma unroll
      for (int bb = 0; bb < KB; ++bb)
#pragma unroll
        for (int i = 0; i < XW; ++i)
          xq[bb][i] =
              (xrow && bb < xnb) ? __ldg(reinterpret_cast<const uint4*>(xr + bb * XB + 8 * i)) : make_uint4(0, 0, 0, 0);
    } else {
#pragma unroll
      for (int bb = 0; bb < KB; ++bb)
#pragma unroll
        for (int i = 0; i < XW; ++i) {
          xv[bb][i] = make_uint4(0, 0, 0, 0);
          if (xrow && (kFull || bb < nb)) {
            if constexpr (XS) xv[bb][i] = lds16(xsb + uint32_t(bb * XB * 2 + 16 * i));
            else if constexpr (XR) xv[bb][i] = lds16(xsb + uint32_t(st * p.m * XRP + bb * XB * 2 + 16 * i));
            else xv[bb][i] = __ldg(reinterpret_cast<const uint4*>(xr + bb * XB + 8 * i));
          }
        }
      xr += KB * XB;
    }
    if constexpr (XS) xsb += uint32_t(KB * XB * 2);
    cp_wait<FR ? D - 1 : D - 2>();
    __syncwarp();
    if constexpr (ST) {
      if (first) stamp(3);
      first = false;
    }
    if constexpr (FR) cp_commit();  // nothing left to issue: an empty group
    else issue((st + D - 1) % D);
    const uint32_t sb = ring + uint32_t(st * SB);
#pragma unroll
    for (int bb = 0; bb < KB; ++bb) {
      if (kFull || bb < nb) {
#pragma unroll
        for (int rt = 0; rt < RT; ++rt) {
          const uint32_t fb = sb + ((bb & 1) ? fa_odd : fa_even) + uint32_t(64 * bb);
          const uint4 wa = lds16(fb + uint32_t(16 * rt * P));
          const uint4 wb = lds16(fb + uint32_t((16 * rt + 8) * P));
#pragma unroll
          for (int s = 0; s < F::kSteps; ++s) {
            uint32_t a[4];
            F::a(wa, s, a[0], a[2]);
            F::a(wb, s, a[1], a[3]);
            const uint4& xs = xv[bb][(2 * s) / 4];
            mma16816<TB>(acc[rt][s & 1], a, word(xs, (2 * s) % 4), word(xs, (2 * s) % 4 + 1));
          }
        }
      }
    }
  };
  const int64_t nst = (b1 - b0 + KB - 1) / KB;
  for (int64_t j0 = 0; j0 < nst; j0 += D) {
#pragma unroll
    for (int st = 0; st < D; ++st) {
      const int64_t j = j0 + st;
      const int64_t nbl = b1 - b0 - j * KB;
      if (nbl >= KB) stage(st, KB, std::true_type{});
      else if (nbl > 0) stage(st, int(nbl), std::false_type{});
      else if constexpr (FR) cp_commit();
      else issue((st + D - 1) % D);  // keeps the group count uniform (empty groups)
    }
  }
  cp_wait<0>();
  stamp(4);

  // the warps' sums, added in warp order (through the ring memory, free now)
  float* red = reinterpret_cast<float*>(smem);  // [nw][32][4 RT]
  if (nw > 1) {
    __syncthreads();
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[(warp * 32 + lane) * 4 * RT + 4 * rt + e] = w8_warp_sum<XR>(acc[rt], e, xinv_w[warp], t, p.m);
    __syncthreads();
  }
  stamp(5);
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {  // warp w stores row tiles w, w + nw, ...
    if (rt % nw != warp) continue;
    const int S = gridDim.y, sl = blockIdx.y;
    float4 ws = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (nw > 1) ws = warps_sum4(red + lane * 4 * RT + 4 * rt, 32 * 4 * RT, nw);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = w8_warp_sum<XR>(acc[rt], e, xinv_w[warp], t, p.m);
      if (nw > 1) v = f4_get(ws, e);
      const int m = 2 * t + (e & 1);
      const int64_t row = row0 + 16 * rt + g + (e >= 2 ? 8 : 0);
      if (m < p.m && row < p.n) {
        if constexpr (XS) v *= xinv_s[m];  // 2^-c: exact
        else if constexpr (!XR) v *= xg[e & 1];  // 1 without the x kernel
        if constexpr (F::kScaled) v *= rsc[rt][e >> 1];
        if (S == 1) store_out(p.y, p.out, m * p.n + row, v);
        else p.part[(int64_t(sl) * p.m + m) * p.n + row] = v;
      }
    }
  }
  if constexpr (ST) {
    if (stp) {
      uint32_t sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      stp[6] = w8_globaltimer();
      stp[7] = sm;
    }
  }
}

}  // namespace gk::cuda::gemv_detail
