// int4 (W4A16, group scales and zero points, groups of 32 / 64 / 128) GEMV on the tensor
// cores with every mma k-step inside one group: gemv_mma.cuh's MInt4 lets each lane own a
// 32-weight chunk, so with groups of 32 or 64 a k-step mixes groups and each group costs a
// masked mma of its own; here a warp stages its tile and lanes pick their bytes freely.
//
// A CTA owns 16 rows; its warps (1..kIW, warps_for) take tiles of 256 weights of every row (128 bytes of
// codes) in turn along k. A warp copies the tile's codes (16-byte cp.async) and the rows'
// 256 / G group scales (4-byte cp.async) into its ring of D stages in shared memory, D - 1
// tiles ahead, and loads the rows' zero points into registers at the same time. Lane
// (g, t) takes rows g and g + 8 and, of each 32-weight block of the tile, code bytes
// 4t..4t+3 (weights 8t..8t+7: byte i holds weights 2i (low nibble) and 2i + 1): two k-steps
// whose pairs are (q - z) exactly in bf16/fp16, with x row g (g < M, else zeros) at the
// same k; a group's fp32 mma sum (its G / 32 blocks) times its scale goes to fp32 accumulators. The
// warps' sums are added in warp order (gemv_stage.cuh), split-K slices by the second pass.
// Needs K % 256 == 0 and 16-byte aligned code rows (the front end checks the rows).
#include "common/gemv_gguf.cuh"
#include "common/gemv_stage.cuh"
#include "core/cuda_util.h"

namespace gk::cuda {

namespace {

using namespace gemv_detail;

constexpr int kIW = 8;     // warps per CTA
constexpr int kRS = 144;   // shared bytes per tile row (128 + 16: no bank conflicts)
constexpr int kStg = 4;    // ring stages

// Zero points of one row for a tile: 256 / G bytes (G = 32: 8, 64: 4, 128: 2), loaded whole.
template <int G>
struct Zp {
  uint32_t lo, hi;
  __device__ static Zp load(const uint8_t* z) {
    if constexpr (G == 32) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(z));
      return {v.x, v.y};
    } else if constexpr (G == 64) {
      return {__ldg(reinterpret_cast<const uint32_t*>(z)), 0u};
    } else {
      return {uint32_t(__ldg(reinterpret_cast<const uint16_t*>(z))), 0u};
    }
  }
  // the zero point of 32-weight block b (0..7) of the tile
  __device__ uint32_t of(int b) const {
    const int gi = b * 32 / G;
    return ((gi < 4 ? lo : hi) >> (8 * (gi & 3))) & 0xffu;
  }
};

template <class T, int G>
__global__ void __launch_bounds__(kIW * 32, 2) k_int4_mma(const QGemvArgs p) {
  constexpr int NG = 256 / G;               // groups per tile row
  constexpr int CODES = 16 * kRS;           // code bytes of a stage
  constexpr int STAGE = CODES + 16 * NG * 4;  // + the scales
  constexpr int D = kStg;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int64_t ra = row0 + g < p.n ? row0 + g : p.n - 1, rb = row0 + g + 8 < p.n ? row0 + g + 8 : p.n - 1;
  const int64_t ntile = p.k / 256, ngr = p.k / G;  // tiles, groups per row
  const int S = gridDim.y, s = blockIdx.y;
  const int64_t tps = (ntile + S - 1) / S;
  const int64_t t0 = int64_t(s) * tps, t1 = std::min(ntile, t0 + tps);
  const bool xrow = g < p.m;
  const T* xr = static_cast<const T*>(p.x) + (xrow ? g : 0) * p.x_rs;
  const uint8_t* q = static_cast<const uint8_t*>(p.q);
  constexpr uint32_t kMag = std::is_same_v<T, bf16> ? 0x4300u : 0x6400u;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};

  extern __shared__ uint4 ring[];
  const uint32_t wbase = smem_addr(ring) + uint32_t(warp * D * STAGE);
  Zp<G> za[D], zb[D];
  const int64_t tb = t0 + warp;
  auto issue = [&](int st, int64_t j) {
    const int64_t tt = tb + j * nw;
    if (tt < t1) {
      const uint32_t sb = wbase + uint32_t(st * STAGE);
#pragma unroll
      for (int u = 0; u < 4; ++u) {  // 16 rows x 8 chunks
        const int i = lane + 32 * u, r = i / 8, c = i % 8;
        const int64_t row = row0 + r < p.n ? row0 + r : p.n - 1;
        cp_async16(sb + uint32_t(r * kRS + c * 16), q + row * p.q_rs + tt * 128 + c * 16);
      }
      for (int i = lane; i < 16 * NG; i += 32) {  // 16 rows x NG scales
        const int r = i / NG, c = i % NG;
        const int64_t row = row0 + r < p.n ? row0 + r : p.n - 1;
        cp_async4(sb + uint32_t(CODES + (r * NG + c) * 4), p.scales + row * ngr + tt * NG + c);
      }
      za[st] = Zp<G>::load(p.zeros + ra * ngr + tt * NG);
      zb[st] = Zp<G>::load(p.zeros + rb * ngr + tt * NG);
    }
    cp_commit();
  };
  auto consume = [&](int st, int64_t tt) {
    const uint32_t sb = wbase + uint32_t(st * STAGE);
    const uint32_t ca = sb + uint32_t(g * kRS + 4 * t), cbk = ca + 8 * kRS;
    const uint32_t sca = sb + uint32_t(CODES + g * NG * 4), scb = sca + 8 * NG * 4;
    const int64_t kb0 = tt * 256;
    constexpr int BPG = G / 32;  // blocks per group: their mma sums share the group's scale
#pragma unroll
    for (int gi = 0; gi < NG; ++gi) {
      const uint32_t zpa = kMag | za[st].of(gi * BPG), zpb = kMag | zb[st].of(gi * BPG);
      const uint32_t z2a = zpa | (zpa << 16), z2b = zpb | (zpb << 16);
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int bb = 0; bb < BPG; ++bb) {
        const int b = gi * BPG + bb;
        uint4 xv = make_uint4(0, 0, 0, 0);
        if (xrow) xv = __ldg(reinterpret_cast<const uint4*>(xr + kb0 + 32 * b + 8 * t));
        const uint32_t ua = lds_u32(ca + 16 * b), ub = lds_u32(cbk + 16 * b);
        const uint32_t ha = ua >> 4, hb = ub >> 4;
        uint32_t pa[4], pb[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // byte i: (low, high nibble) = weights (8t + 2i, 8t + 2i + 1)
          const uint32_t sel = uint32_t(i) | (uint32_t(4 + i) << 8);
          pa[i] = hsub2u<T>((__byte_perm(ua, ha, sel) & 0x000f000fu) | (kMag | (kMag << 16)), z2a);
          pb[i] = hsub2u<T>((__byte_perm(ub, hb, sel) & 0x000f000fu) | (kMag | (kMag << 16)), z2b);
        }
        const uint32_t a0[4] = {pa[0], pb[0], pa[1], pb[1]}, a1[4] = {pa[2], pb[2], pa[3], pb[3]};
        mma16816<T>(c, a0, xv.x, xv.y);
        mma16816<T>(c, a1, xv.z, xv.w);
      }
      const float sa = lds_f32(sca + 4 * gi), sbv = lds_f32(scb + 4 * gi);
      acc[0] = fmaf(sa, c[0], acc[0]);
      acc[1] = fmaf(sa, c[1], acc[1]);
      acc[2] = fmaf(sbv, c[2], acc[2]);
      acc[3] = fmaf(sbv, c[3], acc[3]);
    }
  };
  pdl_trigger();
#pragma unroll
  for (int st = 0; st < D - 1; ++st) issue(st, st);
  pdl_wait();
  for (int64_t j0 = 0; tb + j0 * nw < t1; j0 += D) {
#pragma unroll
    for (int st = 0; st < D; ++st) {
      __syncwarp();  // every lane is done with the stage the next copy overwrites
      issue((st + D - 1) % D, j0 + st + D - 1);
      cp_wait<D - 1>();
      __syncwarp();  // every lane's copies of this stage are visible to the warp
      const int64_t tt = tb + (j0 + st) * nw;
      if (tt < t1) consume(st, tt);
    }
  }
  cp_wait<0>();
  store_quad_sums<kIW>(p, acc, row0, s, S);
}

template <class T, int G>
void launch(const QGemvArgs& p, cudaStream_t st) {
  constexpr int smem_warp = kStg * (16 * kRS + 16 * (256 / G) * 4);
  const int64_t blocks = (p.n + 15) / 16;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  dim3 grid(unsigned(blocks), unsigned(std::max(1, p.split)));
  const int nw = warps_for(p.n, (p.k / 256 + grid.y - 1) / grid.y);
  smem_limit<k_int4_mma<T, G>>(kIW * smem_warp);
  launch_ex(k_int4_mma<T, G>, grid, nw * 32, nw * smem_warp, st, p.variant != 2, p);
  GK_LAUNCH_CHECK("qgemv_int4_mma");
  if (p.split > 1) launch_sum_q(p, st);
}

}  // namespace

bool int4_mma_applies(const QGemvArgs& p) {
  return p.fmt == QFormat::int4 && (p.group == 32 || p.group == 64 || p.group == 128) && p.k % 256 == 0 &&
         reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && p.q_rs % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && p.x_rs % 8 == 0 &&
         reinterpret_cast<uintptr_t>(p.zeros) % 8 == 0 && reinterpret_cast<uintptr_t>(p.scales) % 4 == 0;
}

template <class T>
void launch_int4_mma(const QGemvArgs& p, cudaStream_t st) {
  if (p.group == 32) return launch<T, 32>(p, st);
  if (p.group == 64) return launch<T, 64>(p, st);
  return launch<T, 128>(p, st);
}
template void launch_int4_mma<bf16>(const QGemvArgs&, cudaStream_t);
template void launch_int4_mma<f16>(const QGemvArgs&, cudaStream_t);

}  // namespace gk::cuda
