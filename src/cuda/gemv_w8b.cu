// Decode GEMV of 8-bit weights with bf16 x whose weight tiles arrive by bulk copies (session 11;
// GPUKIT_GEMV_W8's XS 4, a benchmarking configuration, off by default): k_w8<SFp8B / SInt8B, KB, D>
// (src/cuda/common/gemv_w8.cuh) with the same plan, the same k range per warp, the same decode,
// mma sequence, accumulators and warp order, so the same bits, but
// - each stage of a warp's ring is 16 row segments of KB * 64 bytes, one cp.async.bulk per row
//   (lanes 0-15), completing on the slot's mbarrier: no per-lane 16-byte copies, no per-lane
//   row pointers, no commit groups;
// - the stage's rows lie even rows first, odd rows 64 bytes after the even ones, so the
//   fragment reads of rows g and g + 1 fall in different halves of the 128-byte bank window
//   (k_w8 swizzles its 16-byte chunks instead; a bulk copy writes its bytes contiguously);
// - x (the B operand) is loaded one block ahead instead of a whole stage ahead.
// The point is the registers: k_w8 holds a stage's x in registers (102 at KB 4 / ring 2, 115
// with a ring of 3, 128 at KB 8), and the registers a GEMV holds decide when the next kernel's
// CTAs can start (docs/notes/short-s11.md).
#include <algorithm>
#include <type_traits>

#include "common/gemv_w8.cuh"
#include "common/tma.cuh"
#include "core/cuda_util.h"
#include "cuda/gemv_w8b.h"

namespace gk::cuda::gemv_detail {
namespace {

using sm90::mbar_expect_tx;
using sm90::mbar_fence_init;
using sm90::mbar_init;
using sm90::mbar_wait;

__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Bytes of one stage: 16 rows of KB 64-byte blocks, the odd rows 64 bytes after the even ones.
constexpr int w8b_stage_bytes(int kb) { return 16 * kb * 64 + 64; }
// Offset of row r (0..15) in a stage.
template <int KB>
__device__ __forceinline__ uint32_t w8b_row(int r) {
  return uint32_t((r & 1) ? 8 * KB * 64 + 64 + (r >> 1) * KB * 64 : (r >> 1) * KB * 64);
}

template <class F, int KB, int D>
__global__ void __launch_bounds__(256, 2) k_w8b(const KArgs p) {
  static_assert(F::EB == 1 && std::is_same_v<typename F::TB, bf16>, "8-bit weights decoded to bf16, bf16 x");
  static_assert(D >= 2 && D <= 4 && (KB == 4 || KB == 8), "a ring of 2..4 stages of 4 or 8 blocks");
  using TB = typename F::TB;
  constexpr int SB = w8b_stage_bytes(KB);
  constexpr int XB = 64;  // x elements per 64-byte block (8-bit weights)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int64_t nblk = p.k / 64;
  const int64_t parts = int64_t(gridDim.y) * nw, pi = int64_t(blockIdx.y) * nw + warp;
  const int64_t b0 = nblk * pi / parts, b1 = nblk * (pi + 1) / parts;
  const int nst = int((b1 - b0 + KB - 1) / KB);

  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t bars[8][D];
  const uint32_t ring = smem_addr(smem) + uint32_t(warp * D * SB);
  const uint32_t bar0 = smem_addr(&bars[warp][0]);
  if (lane == 0) {
#pragma unroll
    for (int s = 0; s < D; ++s) mbar_init(bar0 + 8 * s, 1);
    mbar_fence_init();
  }
  __syncwarp();
  // lanes 0-15 copy row `lane` of each stage (rows past N read row N - 1, as k_w8's copies)
  const int64_t crow = row0 + lane < p.n ? row0 + lane : p.n - 1;
  const uint8_t* csrc = p.q + crow * p.q_rs + b0 * 64;
  const uint32_t cdst = ring + w8b_row<KB>(lane & 15);
  auto issue = [&](int j) {  // stage j of the warp into slot j % D
    const int64_t nb = min(int64_t(KB), b1 - b0 - int64_t(j) * KB);
    const int s = j % D;
    if (lane == 0) mbar_expect_tx(bar0 + 8 * s, uint32_t(16 * nb * 64));
    __syncwarp();
    if (lane < 16) bulk_g2s(cdst + uint32_t(s * SB), csrc + int64_t(j) * KB * 64, uint32_t(nb * 64), bar0 + 8 * s);
  };

  float rsc[2];  // the row scales (weights: never written by a kernel, read before the wait)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row0 + g + 8 * h;
    rsc[h] = __ldg(p.scales + (row < p.n ? row : p.n - 1));
  }
  pdl_trigger();
  const int pro = nst < D - 1 ? nst : D - 1;
  for (int j = 0; j < pro; ++j) issue(j);
  pdl_wait();

  float acc[2][4];
#pragma unroll
  for (int e = 0; e < 4; ++e) acc[0][e] = acc[1][e] = 0.0f;
  const bool xrow = g < p.m;
  const TB* xr = static_cast<const TB*>(p.x) + (xrow ? g : 0) * p.x_rs + t * 16 + b0 * XB;
  const uint32_t fa = w8b_row<KB>(g) + uint32_t(16 * t), fb = w8b_row<KB>(g + 8) + uint32_t(16 * t);
  uint4 xn[2];  // the next block's x
  auto load_x = [&](int64_t blk) {  // block blk of the warp's range (blk < b1 - b0)
#pragma unroll
    for (int i = 0; i < 2; ++i)
      xn[i] = (xrow && blk < b1 - b0) ? __ldg(reinterpret_cast<const uint4*>(xr + blk * XB + 8 * i)) : make_uint4(0, 0, 0, 0);
  };
  load_x(0);
  for (int j = 0; j < nst; ++j) {
    const int s = j % D;
    mbar_wait(bar0 + 8 * s, uint32_t((j / D) & 1));
    __syncwarp();  // every lane is past its reads of the slot issued next (stage j - 1's)
    if (j + D - 1 < nst) issue(j + D - 1);
    const int nb = int(min(int64_t(KB), b1 - b0 - int64_t(j) * KB));
    const uint32_t sb = ring + uint32_t(s * SB);
#pragma unroll
    for (int bb = 0; bb < KB; ++bb) {
      if (bb < nb) {
        const uint4 x0 = xn[0], x1 = xn[1];
        load_x(int64_t(j) * KB + bb + 1);
        const uint4 wa = lds16(sb + fa + uint32_t(64 * bb));
        const uint4 wb = lds16(sb + fb + uint32_t(64 * bb));
#pragma unroll
        for (int st = 0; st < F::kSteps; ++st) {
          uint32_t a[4];
          F::a(wa, st, a[0], a[2]);
          F::a(wb, st, a[1], a[3]);
          const uint4& xs = st < 2 ? x0 : x1;
          mma16816<TB>(acc[st & 1], a, word(xs, (2 * st) % 4), word(xs, (2 * st) % 4 + 1));
        }
      }
    }
  }

  // the warps' sums, added in warp order (through the ring memory: every copy has landed)
  float* red = reinterpret_cast<float*>(smem);  // [nw][32][4]
  if (nw > 1) {
    __syncthreads();
#pragma unroll
    for (int e = 0; e < 4; ++e) red[(warp * 32 + lane) * 4 + e] = acc[0][e] + acc[1][e];
    __syncthreads();
  }
  if (warp != 0) return;
  const int S = gridDim.y, sl = blockIdx.y;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float v = acc[0][e] + acc[1][e];
    if (nw > 1) {
      v = red[lane * 4 + e];
      for (int w = 1; w < nw; ++w) v += red[(w * 32 + lane) * 4 + e];
    }
    const int m = 2 * t + (e & 1);
    const int64_t row = row0 + g + (e >= 2 ? 8 : 0);
    if (m < p.m && row < p.n) {
      v *= rsc[e >> 1];
      if (S == 1) store_out(p.y, p.out, m * p.n + row, v);
      else p.part[(int64_t(sl) * p.m + m) * p.n + row] = v;
    }
  }
}

template <class F, int KB, int D>
void launch_kb(const KArgs& p, int nw, int split, cudaStream_t st, bool spread) {
  constexpr int kSmemMax = 200 * 1024;
  constexpr int64_t kSmSmem = 228 * 1024;
  smem_limit<k_w8b<F, KB, D>>(kSmemMax);
  const int64_t blocks = (p.n + 15) / 16;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  int smem = nw * D * w8b_stage_bytes(KB);
  if (smem > kSmemMax) throw ValueError("gemv: the bulk-copy kernel's shared memory does not fit");
  const int64_t per_sm = (blocks * split + 131) / 132;  // as k_w8's launch (launch_kd)
  if (spread && per_sm >= 1 && per_sm <= 16) {
    const int64_t cap = kSmSmem / (per_sm + 1) - 1024 - 512 + 256;
    if (per_sm * (cap + 1024 + 512) <= kSmSmem && cap > smem) smem = int(std::min<int64_t>(cap, kSmemMax));
  }
  launch_ex(k_w8b<F, KB, D>, dim3(unsigned(blocks), unsigned(split)), nw * 32, smem, st, p.variant != 2, p);
  GK_LAUNCH_CHECK("gemv_w8b");
}

template <class F>
void launch_f(const KArgs& p, int nw, int split, int kb, int d, bool spread, cudaStream_t st) {
  if (kb == 8) return launch_kb<F, 8, 2>(p, nw, split, st, spread);
  if (d == 4) return launch_kb<F, 4, 4>(p, nw, split, st, spread);
  if (d == 3) return launch_kb<F, 4, 3>(p, nw, split, st, spread);
  return launch_kb<F, 4, 2>(p, nw, split, st, spread);
}

}  // namespace

void launch_w8b(bool fp8, const KArgs& p, int nw, int split, int kb, int d, bool spread, cudaStream_t st) {
  if (fp8) return launch_f<SFp8B>(p, nw, split, kb, d, spread, st);
  return launch_f<SInt8B>(p, nw, split, kb, d, spread, st);
}

}  // namespace gk::cuda::gemv_detail
