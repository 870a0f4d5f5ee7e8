// GEMV over the 32-weight GGUF blocks Q4_0 (18 B), Q4_1 (20 B), Q8_0 (34 B) on the tensor
// cores, read directly from the file's blocks (layouts: ops/gguf_blocks.h).
//
// A CTA owns 16 weight rows; its warps (1..kGW, warps_for) take tiles of kTB = 8 blocks of every row
// (256 weights; 8 * BB bytes, a multiple of 16) in turn along k. A warp copies its tile
// (16 rows x 8 blocks) with coalesced 16-byte cp.async into its own ring of D stages in
// shared memory, D - 1 tiles ahead, and decodes from there: lane (g, t) takes rows g and
// g + 8 and, of each block, the 8 weights it feeds to two mma.sync.m16n8k16 steps
// (4-bit: code bytes 4t..4t+3, low nibbles = weights 4t..4t+3 in step 0, high nibbles =
// weights 16 + 4t.. in step 1; 8-bit: bytes 8t..8t+7), turned into exact bf16/fp16
// values (Q4_0: q - 8, Q4_1: q, Q8_0: the int8) with byte permutes and one packed
// subtraction per pair; x row g (g < M, else zeros) at the same k positions is the B
// operand. Per block: the fp32 mma sum times the block's scale d, plus for Q4_1 m times
// the sum of x over the block (a second mma with ones) -- added to fp32 accumulators.
// The warps' sums are added in warp order, split-K slices by the second pass of
// gemv.cu in slice order: the same bits every run and for a row alone or in a batch.
// Needs 16-byte aligned rows and K % 256 == 0 (else quant_gguf.cu's kernels run).
#include "common/gemv_gguf.cuh"
#include "common/gemv_stage.cuh"
#include "core/cuda_util.h"

namespace gk::cuda {

namespace {

using namespace gemv_detail;

constexpr int kGW = 8;  // warps per CTA
constexpr int kTB = 8;  // blocks per row per tile

template <int F>
struct GBM;
template <>
struct GBM<int(QFormat::q4_0)> {
  static constexpr int BB = gguf::kQ4_0Bytes, QOFF = 2, D = 4, RS = 144;  // RS: smem bytes per row
  static constexpr bool k4 = true, kMin = false;
};
template <>
struct GBM<int(QFormat::q4_1)> {
  static constexpr int BB = gguf::kQ4_1Bytes, QOFF = 4, D = 4, RS = 176;  // 160 + 16: no bank conflicts
  static constexpr bool k4 = true, kMin = true;
};
template <>
struct GBM<int(QFormat::q8_0)> {
  static constexpr int BB = gguf::kQ8_0Bytes, QOFF = 2, D = 3, RS = 272;
  static constexpr bool k4 = false, kMin = false;
};
// Q6_K: tiles of 2 blocks (420 bytes, 4-byte cp.async: 8 blocks would be the first
// 16-byte multiple), rows 432 bytes apart in shared memory (no bank conflicts).
template <>
struct GBM<int(QFormat::q6_k)> {
  static constexpr int BB = gguf::kQ6_KBytes, QOFF = 0, D = 2, RS = 432;
  static constexpr bool k4 = false, kMin = false;
};
// Q4_K: tiles of 1 block (144 bytes: 9 chunks).
template <>
struct GBM<int(QFormat::q4_k)> {
  static constexpr int BB = gguf::kQ4_KBytes, QOFF = 16, D = 4, RS = 144;
  static constexpr bool k4 = true, kMin = true;
};
template <int F>
constexpr int kTileW = F == int(QFormat::q6_k) ? 512 : (F == int(QFormat::q4_k) ? 256 : 32 * kTB);  // weights
template <int F>
constexpr int kTileB = F == int(QFormat::q6_k) ? 2 * gguf::kQ6_KBytes
                                               : (F == int(QFormat::q4_k) ? gguf::kQ4_KBytes : kTB * GBM<F>::BB);

template <class T, int F>
__global__ void __launch_bounds__(kGW * 32, 2) k_gguf_mma(const QGemvArgs p) {
  using B = GBM<F>;
  constexpr int BB = B::BB, D = B::D, RS = B::RS;
  constexpr bool kQ6 = F == int(QFormat::q6_k);
  constexpr int CB = kQ6 ? 4 : 16;          // bytes per cp.async
  constexpr int C = kTileB<F> / CB;         // copies per tile row
  constexpr int STAGE = 16 * RS;    // bytes of a stage
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int64_t ntile = p.k / kTileW<F>;
  const int S = gridDim.y, s = blockIdx.y;
  const int64_t tps = (ntile + S - 1) / S;
  const int64_t t0 = int64_t(s) * tps, t1 = std::min(ntile, t0 + tps);
  const bool xrow = g < p.m;
  const T* xr = static_cast<const T*>(p.x) + (xrow ? g : 0) * p.x_rs;
  const uint8_t* q = static_cast<const uint8_t*>(p.q);
  const uint32_t ones = splat<T>(1.0f);
  constexpr uint32_t kSub4 = B::kMin ? (std::is_same_v<T, bf16> ? 0x43004300u : 0x64006400u)
                                     : (std::is_same_v<T, bf16> ? 0x43084308u : 0x64086408u);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};

  extern __shared__ uint4 ring[];
  const uint32_t wbase = smem_addr(ring) + uint32_t(warp * D * STAGE);
  const int64_t tb = t0 + warp;
  auto issue = [&](int st, int64_t j) {
    const int64_t tt = tb + j * nw;
    if (tt < t1) {
      for (int i = lane; i < 16 * C; i += 32) {
        const int r = i / C, c = i % C;
        const int64_t row = row0 + r < p.n ? row0 + r : p.n - 1;
        const uint32_t dst = wbase + uint32_t(st * STAGE + r * RS + c * CB);
        const uint8_t* src = q + row * p.q_rs + tt * kTileB<F> + c * CB;
        if constexpr (kQ6) cp_async4(dst, src);
        else cp_async16(dst, src);
      }
    }
    cp_commit();
  };
  auto consume_q6 = [&](int st, int64_t tt) {
    // sub-block i (16 weights, one k-step) of block b: lane t takes its weights 4t..4t+3
    constexpr uint32_t kSub = std::is_same_v<T, bf16> ? 0x43204320u : 0x64206420u;  // magic + 32
    const uint32_t ra = wbase + uint32_t(st * STAGE + g * RS), rb = ra + 8 * RS;
#pragma unroll 1
    for (int b = 0; b < 2; ++b) {
      const uint32_t ba = ra + b * BB, bbk = rb + b * BB;
      const float da = f16f(lds_u16(ba + 208)), db = f16f(lds_u16(bbk + 208));
      const int64_t kb = (tt * 2 + b) * 256;
      // the words of ql (2) and qh (1) that lane t needs serve 4 sub-blocks each:
      // i = 8h + 2s + q reads ql[64h + 32 (s & 1) + 16q + 4t..] >> 4 (s >> 1) and
      // qh[32h + 16q + 4t..] >> 2s
#pragma unroll 1
      for (int hq = 0; hq < 4; ++hq) {
        const int h = hq >> 1, q = hq & 1;
        const uint32_t ol = 64 * h + 16 * q + 4 * t, oh = 128 + 32 * h + 16 * q + 4 * t;
        const uint32_t la0 = lds32_2(ba + ol), la1 = lds32_2(ba + ol + 32), lha = lds32_2(ba + oh);
        const uint32_t lb0 = lds32_2(bbk + ol), lb1 = lds32_2(bbk + ol + 32), lhb = lds32_2(bbk + oh);
#pragma unroll
        for (int sblk = 0; sblk < 4; ++sblk) {
          const int i = 8 * h + 2 * sblk + q, sl = 4 * (sblk >> 1), sh = 2 * sblk;
          uint2 xv = make_uint2(0, 0);
          if (xrow) xv = __ldg(reinterpret_cast<const uint2*>(xr + kb + 16 * i + 4 * t));
          const uint32_t ca = (((sblk & 1) ? la1 : la0) >> sl & 0x0f0f0f0fu) | (((lha >> sh) & 0x03030303u) << 4);
          const uint32_t cb = (((sblk & 1) ? lb1 : lb0) >> sl & 0x0f0f0f0fu) | (((lhb >> sh) & 0x03030303u) << 4);
          const uint32_t a[4] = {byte_pair<T>(ca, 0, kSub), byte_pair<T>(cb, 0, kSub), byte_pair<T>(ca, 2, kSub),
                                 byte_pair<T>(cb, 2, kSub)};
          float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          mma16816<T>(c, a, xv.x, xv.y);
          const float sa = da * float(int8_t(lds_u8(ba + 192 + i))), sb = db * float(int8_t(lds_u8(bbk + 192 + i)));
          acc[0] = fmaf(sa, c[0], acc[0]);
          acc[1] = fmaf(sa, c[1], acc[1]);
          acc[2] = fmaf(sb, c[2], acc[2]);
          acc[3] = fmaf(sb, c[3], acc[3]);
        }
      }
    }
  };
  auto consume_q4k = [&](int st, int64_t tt) {
    // sub-blocks 2c (low nibbles) and 2c + 1 (high) of qs[32c .. 32c + 31]: lane t takes
    // bytes 4t..4t+3 (step 0) and 16 + 4t.. (step 1) of the 32; w = d sc q - dmin m
    constexpr uint32_t kSub = std::is_same_v<T, bf16> ? 0x43004300u : 0x64006400u;
    const uint32_t ba = wbase + uint32_t(st * STAGE + g * RS), bbk = ba + 8 * RS;
    const uint32_t hda = lds_u32(ba), hdb = lds_u32(bbk);
    struct Sc {
      uint32_t w[3];
      __device__ uint32_t operator[](int i) const { return (w[i >> 2] >> (8 * (i & 3))) & 0xffu; }
    };
    const Sc sa{{lds_u32(ba + 4), lds_u32(ba + 8), lds_u32(ba + 12)}};
    const Sc sb{{lds_u32(bbk + 4), lds_u32(bbk + 8), lds_u32(bbk + 12)}};
    const float da = f16f(hda & 0xffffu), dma = f16f(hda >> 16), db = f16f(hdb & 0xffffu), dmb = f16f(hdb >> 16);
    const int64_t kb = tt * 256;
    const uint32_t o[4] = {ones, ones, ones, ones};
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint32_t ua0 = lds_u32(ba + 16 + 32 * c + 4 * t), ua1 = lds_u32(ba + 32 + 32 * c + 4 * t);
      const uint32_t ub0 = lds_u32(bbk + 16 + 32 * c + 4 * t), ub1 = lds_u32(bbk + 32 + 32 * c + 4 * t);
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {  // sub-block 2c + hi
        const int sh = 4 * hi;
        const uint32_t a0v = (ua0 >> sh) & 0x0f0f0f0fu, a1v = (ua1 >> sh) & 0x0f0f0f0fu;
        const uint32_t b0v = (ub0 >> sh) & 0x0f0f0f0fu, b1v = (ub1 >> sh) & 0x0f0f0f0fu;
        const uint32_t A0[4] = {byte_pair<T>(a0v, 0, kSub), byte_pair<T>(b0v, 0, kSub), byte_pair<T>(a0v, 2, kSub),
                                byte_pair<T>(b0v, 2, kSub)};
        const uint32_t A1[4] = {byte_pair<T>(a1v, 0, kSub), byte_pair<T>(b1v, 0, kSub), byte_pair<T>(a1v, 2, kSub),
                                byte_pair<T>(b1v, 2, kSub)};
        uint2 x0 = make_uint2(0, 0), x1 = make_uint2(0, 0);
        if (xrow) {
          x0 = __ldg(reinterpret_cast<const uint2*>(xr + kb + 64 * c + 32 * hi + 4 * t));
          x1 = __ldg(reinterpret_cast<const uint2*>(xr + kb + 64 * c + 32 * hi + 16 + 4 * t));
        }
        float cc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, xs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma16816<T>(cc, A0, x0.x, x0.y);
        mma16816<T>(cc, A1, x1.x, x1.y);
        mma16816<T>(xs, o, x0.x, x0.y);
        mma16816<T>(xs, o, x1.x, x1.y);
        int sca, mna, scb, mnb;
        gguf::k_scale_min(sa, 2 * c + hi, &sca, &mna);
        gguf::k_scale_min(sb, 2 * c + hi, &scb, &mnb);
        const float d1a = da * float(sca), m1a = dma * float(mna), d1b = db * float(scb), m1b = dmb * float(mnb);
        acc[0] = fmaf(d1a, cc[0], acc[0]);
        acc[1] = fmaf(d1a, cc[1], acc[1]);
        acc[2] = fmaf(d1b, cc[2], acc[2]);
        acc[3] = fmaf(d1b, cc[3], acc[3]);
        acc[0] = fmaf(-m1a, xs[0], acc[0]);
        acc[1] = fmaf(-m1a, xs[1], acc[1]);
        acc[2] = fmaf(-m1b, xs[2], acc[2]);
        acc[3] = fmaf(-m1b, xs[3], acc[3]);
      }
    }
  };
  auto consume = [&](int st, int64_t tt) {
    if constexpr (kQ6) {
      consume_q6(st, tt);
      return;
    }
    if constexpr (F == int(QFormat::q4_k)) {
      consume_q4k(st, tt);
      return;
    }
    const uint32_t ra = wbase + uint32_t(st * STAGE + g * RS), rb = ra + 8 * RS;
#pragma unroll 2
    for (int b = 0; b < kTB; ++b) {
      const uint32_t ba = ra + b * BB, bbk = rb + b * BB;
      const int64_t kb = (tt * kTB + b) * 32;
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f}, xs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      uint32_t a0[4], a1[4], x0[2], x1[2];  // steps 0 and 1
      if constexpr (B::k4) {
        uint2 xa = make_uint2(0, 0), xb = make_uint2(0, 0);
        if (xrow) {
          xa = __ldg(reinterpret_cast<const uint2*>(xr + kb + 4 * t));
          xb = __ldg(reinterpret_cast<const uint2*>(xr + kb + 16 + 4 * t));
        }
        const uint32_t ua = lds32_2(ba + B::QOFF + 4 * t), ub = lds32_2(bbk + B::QOFF + 4 * t);
        const uint32_t La = ua & 0x0f0f0f0fu, Ha = (ua >> 4) & 0x0f0f0f0fu;
        const uint32_t Lb = ub & 0x0f0f0f0fu, Hb = (ub >> 4) & 0x0f0f0f0fu;
        a0[0] = byte_pair<T>(La, 0, kSub4);
        a0[1] = byte_pair<T>(Lb, 0, kSub4);
        a0[2] = byte_pair<T>(La, 2, kSub4);
        a0[3] = byte_pair<T>(Lb, 2, kSub4);
        a1[0] = byte_pair<T>(Ha, 0, kSub4);
        a1[1] = byte_pair<T>(Hb, 0, kSub4);
        a1[2] = byte_pair<T>(Ha, 2, kSub4);
        a1[3] = byte_pair<T>(Hb, 2, kSub4);
        x0[0] = xa.x, x0[1] = xa.y, x1[0] = xb.x, x1[1] = xb.y;
      } else {
        uint4 xv = make_uint4(0, 0, 0, 0);
        if (xrow) xv = __ldg(reinterpret_cast<const uint4*>(xr + kb + 8 * t));
        const uint32_t ua0 = lds32_2(ba + B::QOFF + 8 * t), ua1 = lds32_2(ba + B::QOFF + 4 + 8 * t);
        const uint32_t ub0 = lds32_2(bbk + B::QOFF + 8 * t), ub1 = lds32_2(bbk + B::QOFF + 4 + 8 * t);
        a0[0] = int8_pair<T>(ua0, 0);
        a0[1] = int8_pair<T>(ub0, 0);
        a0[2] = int8_pair<T>(ua0, 2);
        a0[3] = int8_pair<T>(ub0, 2);
        a1[0] = int8_pair<T>(ua1, 0);
        a1[1] = int8_pair<T>(ub1, 0);
        a1[2] = int8_pair<T>(ua1, 2);
        a1[3] = int8_pair<T>(ub1, 2);
        x0[0] = xv.x, x0[1] = xv.y, x1[0] = xv.z, x1[1] = xv.w;
      }
      mma16816<T>(c, a0, x0[0], x0[1]);
      mma16816<T>(c, a1, x1[0], x1[1]);
      const float da = f16f(lds_u16(ba)), db = f16f(lds_u16(bbk));
      acc[0] = fmaf(da, c[0], acc[0]);
      acc[1] = fmaf(da, c[1], acc[1]);
      acc[2] = fmaf(db, c[2], acc[2]);
      acc[3] = fmaf(db, c[3], acc[3]);
      if constexpr (B::kMin) {
        const uint32_t o[4] = {ones, ones, ones, ones};
        mma16816<T>(xs, o, x0[0], x0[1]);
        mma16816<T>(xs, o, x1[0], x1[1]);
        const float ma = f16f(lds_u16(ba + 2)), mb = f16f(lds_u16(bbk + 2));
        acc[0] = fmaf(ma, xs[0], acc[0]);
        acc[1] = fmaf(ma, xs[1], acc[1]);
        acc[2] = fmaf(mb, xs[2], acc[2]);
        acc[3] = fmaf(mb, xs[3], acc[3]);
      }
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

  store_quad_sums<kGW>(p, acc, row0, s, S);
}

template <class T, int F>
void launch(const QGemvArgs& p, cudaStream_t st) {
  using B = GBM<F>;
  constexpr int smem_warp = B::D * 16 * B::RS;
  const int64_t blocks = (p.n + 15) / 16;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  dim3 grid(unsigned(blocks), unsigned(std::max(1, p.split)));
  const int nw = warps_for(p.n, (p.k / kTileW<F> + grid.y - 1) / grid.y);
  smem_limit<k_gguf_mma<T, F>>(kGW * smem_warp);
  launch_ex(k_gguf_mma<T, F>, grid, nw * 32, nw * smem_warp, st, p.variant != 2, p);
  GK_LAUNCH_CHECK("qgemv_gguf_mma");
  if (p.split > 1) launch_sum_q(p, st);
}

}  // namespace

bool gguf_mma_applies(const QGemvArgs& p) {
  const bool al_x = reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && p.x_rs % 8 == 0;
  if (p.fmt == QFormat::q6_k)
    return reinterpret_cast<uintptr_t>(p.q) % 4 == 0 && p.q_rs % 4 == 0 && p.k % 512 == 0 && al_x;
  if (p.fmt == QFormat::q4_k) return reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && p.q_rs % 16 == 0 && al_x;
  if (p.fmt != QFormat::q4_0 && p.fmt != QFormat::q4_1 && p.fmt != QFormat::q8_0) return false;
  return reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && p.q_rs % 16 == 0 && p.k % (32 * kTB) == 0 &&
         reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && p.x_rs % 8 == 0;
}

template <class T>
void launch_gguf_mma(const QGemvArgs& p, cudaStream_t st) {
  switch (p.fmt) {
    case QFormat::q4_0: return launch<T, int(QFormat::q4_0)>(p, st);
    case QFormat::q4_1: return launch<T, int(QFormat::q4_1)>(p, st);
    case QFormat::q8_0: return launch<T, int(QFormat::q8_0)>(p, st);
    case QFormat::q6_k: return launch<T, int(QFormat::q6_k)>(p, st);
    case QFormat::q4_k: return launch<T, int(QFormat::q4_k)>(p, st);
    default: throw ValueError("gemv: not a GGUF format of the tensor-core kernel");
  }
}
template void launch_gguf_mma<bf16>(const QGemvArgs&, cudaStream_t);
template void launch_gguf_mma<f16>(const QGemvArgs&, cudaStream_t);

// Split-K for this kernel (CTAs of 16 rows): only when there are fewer CTAs than SMs.
int gguf_mma_split(int64_t n, int64_t k, QFormat f) {
  const int64_t ctas = (n + 15) / 16, tiles = k / (f == QFormat::q6_k ? 512 : (f == QFormat::q4_k ? 256 : 32 * kTB));
  if (ctas >= 132) return 1;
  int64_t sp = (264 + ctas - 1) / ctas;
  sp = std::min<int64_t>({sp, 16, std::max<int64_t>(tiles / (2 * kGW), 1)});
  return int(std::max<int64_t>(sp, 1));
}

}  // namespace gk::cuda
