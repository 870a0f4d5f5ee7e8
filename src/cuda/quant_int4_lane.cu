// int4 (W4A16: group scales and zero points, groups of 32 / 64 / 128) decode GEMV on the
// tensor cores, with the fewest instructions per weight: at 80% of the H200's bandwidth a
// 4-bit GEMV must consume about 6e12 weights/s, which leaves about 0.1 warp-instructions
// per weight for everything (loads, address math, decode, multiply-add).
//
// The weights stay in their [N, K/2] layout (element 2i in the low nibble of byte i). A
// "span" is 128 weights of a row (64 bytes). Lane (g, t) of a warp (g = lane / 4, t = lane
// % 4) owns rows g and g + 8 of each of the warp's MT 16-row m-tiles and, of every span and
// every group h of it (128 / G groups of G weights), the G / 4 weights
// h G + t G / 4 .. + G / 4 - 1 (G / 8 bytes): so the 4 lanes of a quad always read the same
// group and every mma k-step lies inside one group, whose fp32 sum is then multiplied by
// the group's scale. The lane copies its bytes (one 16-byte, two 8-byte or four 4-byte
// cp.async per row and span) and its rows' scales of the span into its own slots of a
// ring of D stages in shared memory (D - 1 spans ahead; a lane reads back only what it
// copied, so no barrier), and the zero points into registers.
//
// Decode of a 32-bit word u (8 nibbles, weights 8w .. 8w + 7 of the lane's piece): the pair
// of nibbles (p, p + 4) sits at bits 4p and 16 + 4p, so (u >> 4p) & 0x000f000f | magic is
// (128 + q_p, 128 + q_{p+4}) in bf16 (1024 + q in fp16) in one lop3, and one packed
// subtraction of (magic + z) twice gives (q - z) exactly. In the mma the pairs (0,4), (1,5)
// are k-step A's columns 2t..2t+1 and 2t+8..2t+9, (2,6), (3,7) k-step B's; x is loaded 8
// elements at a time and its pairs (x0, x4), (x1, x5), (x2, x6), (x3, x7) are built with
// four byte permutes (shared by the MT m-tiles). Rows of x past M: lanes g >= M read row
// M - 1 (valid memory), and their output columns are dropped (mma columns are independent).
//
// Groups of 64 / 128 sum k-steps A and B in two mma chains (half the dependent latency),
// each scaled into the accumulators. A CTA owns 16 MT rows; its nw warps (a function of N
// and K only) take contiguous runs of spans; their sums are added in warp order; split-K slices (small N) by the second pass.
// Same bits on every run and for every M. Needs K % 128 == 0 and aligned rows (applies()).
#include "common/gemv_gguf.cuh"
#include "common/gemv_stage.cuh"
#include "core/cuda_util.h"

namespace gk::cuda {

namespace {

using namespace gemv_detail;

constexpr int kMaxWarps = 16;

__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src) : "memory");
}
template <int B>
__device__ __forceinline__ void cp_async_n(uint32_t dst, const void* src) {
  if constexpr (B == 16) cp_async16(dst, src);
  else if constexpr (B == 8) cp_async8(dst, src);
  else cp_async4(dst, src);
}
__device__ __forceinline__ uint32_t lop_and_or(uint32_t a, uint32_t mask, uint32_t c) {  // (a & mask) | c
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(a), "n"(0x000f000f), "r"(c));
  (void)mask;
  return r;
}
__device__ __forceinline__ uint32_t opaque(uint32_t v) {  // a register the compiler cannot fold into immediates
  asm volatile("" : "+r"(v));
  return v;
}

template <int G>
struct Zb {  // the zero points of one row for one span: 128 / G bytes
  __device__ static uint32_t load(const uint8_t* z) {
    if constexpr (G == 32) return __ldg(reinterpret_cast<const uint32_t*>(z));
    else if constexpr (G == 64) return __ldg(reinterpret_cast<const uint16_t*>(z));
    else return __ldg(z);
  }
};

// Shared bytes of one lane's slots per stage and m-tile: codes of rows a, b (16 each), then
// the scales of rows a, b (SB = 512 / G bytes each).
template <int G>
constexpr int kSB = 512 / G;
template <int G>
constexpr int kLaneBytes = 32 + 2 * kSB<G>;

// u >> s on the FMA pipe (the high word of u * 2^(32 - s)): the integer pipe, half the
// rate of the FMA pipe on Hopper, carries the lop3s and byte permutes.
template <int S>
__device__ __forceinline__ uint32_t shr_hi(uint32_t u) {
  uint32_t r;
  asm("mul.hi.u32 %0, %1, %2;" : "=r"(r) : "r"(u), "n"(1u << (32 - S)));
  return r;
}
template <int S, bool HI>
__device__ __forceinline__ uint32_t shr(uint32_t u) {
  if constexpr (S == 0) return u;
  else if constexpr (HI) return shr_hi<S>(u);
  else return u >> S;
}

// PROBE (benchmarking only, variant 7): the same copies, no decode or products (wrong
// results): the memory ceiling of this access pattern. HI: shifts as mul.hi (variant 8).
template <class T, int G, int MT, int D, bool PROBE = false, bool HI = false>
__global__ void __launch_bounds__(kMaxWarps * 32, 1) k_int4_lane(const QGemvArgs p) {
  constexpr int NG = 128 / G;    // groups per span
  constexpr int LB = G / 8;      // code bytes per lane, row and group
  constexpr int WPG = LB / 4;    // 32-bit words per lane, row and group
  constexpr int SB = kSB<G>;     // scale bytes per row and span
  constexpr int LANE = kLaneBytes<G>;
  constexpr uint32_t kMag = std::is_same_v<T, bf16> ? 0x43004300u : 0x64006400u;  // 128.0 / 1024.0 twice
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16 * MT;
  const int64_t ngr = p.k / G, nspan = p.k / 128;
  // this warp's spans: slice blockIdx.y of gridDim.y, then the warp's run of it
  const int S = gridDim.y, s = blockIdx.y;
  const int64_t per_s = (nspan + S - 1) / S;
  const int64_t s0 = std::min(nspan, int64_t(s) * per_s), s1 = std::min(nspan, s0 + per_s);
  const int64_t per_w = (s1 - s0 + nw - 1) / nw;
  const int64_t j0 = std::min(s1, s0 + warp * per_w), j1 = std::min(s1, j0 + per_w);
  const int64_t cnt = j1 - j0;

  const uint8_t* qp[MT][2];
  const float* sp[MT][2];
  const uint8_t* zp[MT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int64_t row = row0 + 16 * i + g + 8 * r;
      row = row < p.n ? row : p.n - 1;
      qp[i][r] = static_cast<const uint8_t*>(p.q) + row * p.q_rs + j0 * 64 + t * LB;
      sp[i][r] = p.scales + row * ngr + j0 * NG;
      zp[i][r] = p.zeros + row * ngr + j0 * NG;
    }
  }
  const int xrow = g < p.m ? g : int(p.m) - 1;
  const T* xr = static_cast<const T*>(p.x) + int64_t(xrow) * p.x_rs + j0 * 128 + t * (G / 4);

  extern __shared__ uint4 ring[];
  const uint32_t wbase = smem_addr(ring) + uint32_t(warp) * uint32_t(D * MT * 32 * LANE);
  auto code_slot = [&](int st, int i, int r) {
    return wbase + uint32_t(((st * MT + i) * 2 + r) * 32 * 16 + lane * 16);
  };
  auto scale_slot = [&](int st, int i, int r) {
    return wbase + uint32_t(D * MT * 2 * 32 * 16) + uint32_t(((st * MT + i) * 2 + r) * 32 * SB + lane * SB);
  };
  uint32_t zr[D][MT][2];
  const uint32_t mag = opaque(kMag);

  auto issue = [&](int st, int64_t j) {  // span j0 + j into stage st
    if (j < cnt) {
#pragma unroll
      for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint8_t* src = qp[i][r] + j * 64;
#pragma unroll
          for (int h = 0; h < NG; ++h) cp_async_n<LB>(code_slot(st, i, r) + h * LB, src + h * (G / 2));
          cp_async_n<SB>(scale_slot(st, i, r), sp[i][r] + j * NG);
          zr[st][i][r] = Zb<G>::load(zp[i][r] + j * NG);
        }
      }
    }
    cp_commit();
  };

  float acc[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

  auto probe = [&](int st) {
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      const uint4 a = lds16(code_slot(st, i, 0)), b = lds16(code_slot(st, i, 1));
      acc[i][0] += __uint_as_float((a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ lds_u32(scale_slot(st, i, 0)) ^
                                    zr[st][i][0]) & 0x007fffffu);
    }
  };
  auto consume = [&](int st, int64_t j) {
    uint4 wv[MT][2];
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      wv[i][0] = lds16(code_slot(st, i, 0));
      wv[i][1] = lds16(code_slot(st, i, 1));
    }
    const T* xj = xr + j * 128;
#pragma unroll
    for (int h = 0; h < NG; ++h) {
      // two chains of mma (k-steps A / B) when a group has 2 or more words: half the latency
      constexpr bool TWO = WPG >= 2;
      float c[MT][4], c2[MT][4];
      uint32_t z2[MT][2];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.0f;
        c2[i][0] = c2[i][1] = c2[i][2] = c2[i][3] = 0.0f;
        // bytes [z_h, magic high byte, z_h, magic high byte]: (magic + z) twice
        const uint32_t sel = uint32_t(h) | (5u << 4) | (uint32_t(h) << 8) | (5u << 12);
        z2[i][0] = __byte_perm(zr[st][i][0], mag, sel);
        z2[i][1] = __byte_perm(zr[st][i][1], mag, sel);
      }
#pragma unroll
      for (int w = 0; w < WPG; ++w) {
        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(xj + h * G + 8 * w));
        const uint32_t bA0 = __byte_perm(xv.x, xv.z, 0x5410u), bA1 = __byte_perm(xv.x, xv.z, 0x7632u);
        const uint32_t bB0 = __byte_perm(xv.y, xv.w, 0x5410u), bB1 = __byte_perm(xv.y, xv.w, 0x7632u);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          const uint32_t ua = word(wv[i][0], h * WPG + w), ub = word(wv[i][1], h * WPG + w);
          uint32_t pa[4], pb[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const uint32_t sa = q == 0 ? ua : (q == 1 ? shr<4, HI>(ua) : (q == 2 ? shr<8, HI>(ua) : shr<12, HI>(ua)));
            const uint32_t sb = q == 0 ? ub : (q == 1 ? shr<4, HI>(ub) : (q == 2 ? shr<8, HI>(ub) : shr<12, HI>(ub)));
            pa[q] = hsub2u<T>(lop_and_or(sa, 0x000f000f, mag), z2[i][0]);
            pb[q] = hsub2u<T>(lop_and_or(sb, 0x000f000f, mag), z2[i][1]);
          }
          const uint32_t aA[4] = {pa[0], pb[0], pa[1], pb[1]};
          const uint32_t aB[4] = {pa[2], pb[2], pa[3], pb[3]};
          mma16816<T>(c[i], aA, bA0, bA1);
          if constexpr (TWO) mma16816<T>(c2[i], aB, bB0, bB1);
          else mma16816<T>(c[i], aB, bB0, bB1);
        }
      }
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const float sa = lds_f32(scale_slot(st, i, 0) + 4 * h), sb = lds_f32(scale_slot(st, i, 1) + 4 * h);
        acc[i][0] = fmaf(sa, c[i][0], acc[i][0]);
        acc[i][1] = fmaf(sa, c[i][1], acc[i][1]);
        acc[i][2] = fmaf(sb, c[i][2], acc[i][2]);
        acc[i][3] = fmaf(sb, c[i][3], acc[i][3]);
        if constexpr (TWO) {
          acc[i][0] = fmaf(sa, c2[i][0], acc[i][0]);
          acc[i][1] = fmaf(sa, c2[i][1], acc[i][1]);
          acc[i][2] = fmaf(sb, c2[i][2], acc[i][2]);
          acc[i][3] = fmaf(sb, c2[i][3], acc[i][3]);
        }
      }
    }
  };

  pdl_trigger();
#pragma unroll
  for (int st = 0; st < D - 1; ++st) issue(st, st);
  pdl_wait();
  for (int64_t jb = 0; jb < cnt; jb += D) {
#pragma unroll
    for (int st = 0; st < D; ++st) {
      issue((st + D - 1) % D, jb + st + D - 1);
      cp_wait<D - 1>();
      if (jb + st < cnt) {
        if constexpr (PROBE) probe(st);
        else consume(st, jb + st);
      }
    }
  }
  cp_wait<0>();
  __syncthreads();  // the ring is reused for the warps' sums
  float* red = reinterpret_cast<float*>(ring);
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[(warp * MT * 4 + i * 4 + e) * 32 + lane] = acc[i][e];
  __syncthreads();
  for (int i = warp; i < MT; i += nw) {  // warp i % nw sums m-tile i over the warps, in warp order
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = red[(i * 4 + e) * 32 + lane];
      for (int w = 1; w < nw; ++w) v += red[(w * MT * 4 + i * 4 + e) * 32 + lane];
      const int m = 2 * t + (e & 1);
      const int64_t row = row0 + 16 * i + g + (e >= 2 ? 8 : 0);
      if (m < p.m && row < p.n) {
        if (S == 1) store_out(p.y, p.out_dtype, m * p.n + row, v);
        else p.part[(int64_t(s) * p.m + m) * p.n + row] = v;
      }
    }
  }
}

// Resident warps per SM the kernel is sized for (128 registers per thread: 16).
constexpr int kWarpsPerSM = 16;
constexpr int kSMs = 132;

template <class T, int G, int MT, int D, bool PROBE = false, bool HI = false>
void launch_cfg(const QGemvArgs& p, cudaStream_t st, int warps_per_sm = kWarpsPerSM) {
  constexpr int per_warp = D * MT * 32 * kLaneBytes<G>;
  const int64_t blocks = (p.n + 16 * MT - 1) / (16 * MT);
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  const int S = std::max(1, p.split);
  const int64_t spans = (p.k / 128 + S - 1) / S;
  // warps per CTA: about kWarpsPerSM resident warps per SM over the GPU, at most the shared
  // memory allows, at least 2 spans per warp. A function of (N, K, split) only.
  const int smem_warps = std::max(1, (227 * 1024) / per_warp);
  const int64_t cap = std::min<int64_t>(kMaxWarps, std::min(warps_per_sm, smem_warps));
  int64_t nw = (int64_t(kSMs) * std::min<int64_t>(warps_per_sm, smem_warps)) / (blocks * S);
  nw = std::max<int64_t>(1, std::min<int64_t>({nw, cap, std::max<int64_t>(1, spans / 2)}));
  const int smem = std::max<int>(int(nw) * per_warp, int(nw) * MT * 4 * 32 * 4);
  smem_limit<k_int4_lane<T, G, MT, D, PROBE, HI>>(std::max(int(cap) * per_warp, kMaxWarps * MT * 4 * 32 * 4));
  launch_ex(k_int4_lane<T, G, MT, D, PROBE, HI>, dim3(unsigned(blocks), unsigned(S)), int(nw) * 32, smem, st, p.variant != 2, p);
  GK_LAUNCH_CHECK("qgemv_int4_lane");
}

// Default ring depth: spans of 16 rows x 64 bytes are small, so 7 in flight per warp (5 for
// groups of 32, whose scale slots are larger: 16 warps per SM still fit).
template <int G>
constexpr int kDepth = G == 32 ? 6 : 8;

template <class T, int G>
void launch_g(const QGemvArgs& p, cudaStream_t st) {
  constexpr int D = kDepth<G>;
  // variants (benchmarking): 4: two m-tiles per warp, 4 stages; 5: 4 stages; 6: two m-tiles,
  // 3 stages; 7: the probe (copies only, wrong results); 8 / 9: shifts on the FMA pipe
  // (mul.hi), one m-tile / two m-tiles with 4 stages; 10: sized for 24 resident warps per SM
  switch (p.variant) {  // 0 and 3: the default configuration
    case 4: launch_cfg<T, G, 2, 4>(p, st); break;
    case 5: launch_cfg<T, G, 1, 4>(p, st); break;
    case 6: launch_cfg<T, G, 2, 3>(p, st); break;
    case 7: launch_cfg<T, G, 1, D, true>(p, st); break;
    case 8: launch_cfg<T, G, 1, D, false, true>(p, st); break;
    case 9: launch_cfg<T, G, 2, 4, false, true>(p, st); break;
    case 10: launch_cfg<T, G, 1, D>(p, st, 24); break;
    default: launch_cfg<T, G, 1, D>(p, st); break;
  }
  if (p.split > 1) launch_sum_q(p, st);
}

}  // namespace

bool int4_lane_applies(const QGemvArgs& p) {
  if (p.fmt != QFormat::int4 || p.k % 128 != 0) return false;
  if (p.group != 32 && p.group != 64 && p.group != 128) return false;
  const auto al = [](const void* v, uintptr_t a) { return reinterpret_cast<uintptr_t>(v) % a == 0; };
  const int lb = int(p.group / 8), sb = int(512 / p.group);
  return al(p.q, uintptr_t(lb)) && p.q_rs % 16 == 0 && al(p.x, 16) && p.x_rs % 8 == 0 &&
         al(p.scales, uintptr_t(sb)) && al(p.zeros, uintptr_t(128 / p.group));
}

// Split-K slices: only when there are fewer 16-row blocks than SMs (N < 2112); at least 8
// spans per slice. A function of (N, K) only.
int int4_lane_split(int64_t n, int64_t k) {
  const int64_t rb = (n + 15) / 16, spans = k / 128;
  if (rb >= kSMs) return 1;
  int64_t sp = (kSMs + rb - 1) / rb;
  sp = std::min<int64_t>({sp, 16, std::max<int64_t>(1, spans / 8)});
  return int(std::max<int64_t>(1, sp));
}

template <class T>
void launch_int4_lane(const QGemvArgs& p, cudaStream_t st) {
  if (p.group == 32) return launch_g<T, 32>(p, st);
  if (p.group == 64) return launch_g<T, 64>(p, st);
  return launch_g<T, 128>(p, st);
}
template void launch_int4_lane<bf16>(const QGemvArgs&, cudaStream_t);
template void launch_int4_lane<f16>(const QGemvArgs&, cudaStream_t);

}  // namespace gk::cuda
