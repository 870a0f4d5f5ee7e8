// attention_prefill on Hopper, warp-specialized (FlashAttention-3 style), bf16 / fp16.
//
// One CTA per (query head, query tile of BM = 128 rows of one sequence), three
// warpgroups. Warpgroup 0 is the producer: one thread issues TMA loads (Q once,
// then K and V tiles of BN keys into a 2- or 3-stage ring of 128-byte-swizzled
// buffers) that complete on mbarriers, and waits on "empty" barriers before
// reusing a stage; it gives its registers away (setmaxnreg). Warpgroups 1 and 2
// each own 64 query rows. Per key tile n they issue S_n = Q K_n^T and then
// O += P_{n-1} V_{n-1} (P from registers) back to back, run the online softmax
// of S_n while the second product runs on the tensor cores, then rescale O and
// convert P_n; K is released right after S_n, V after its product.
//
// Masking, softmax, tile order and output rows are those of the cp.async kernel
// (attention_prefill_sm90.cu): each output row is written by one thread of one
// CTA and every sum has a fixed order, so results are bitwise reproducible.
// Keys past the end of the sequence (read from the next sequence or
// zero-filled past the tensor) always get probability 0.
#include <cstdint>

#include "core/cuda_util.h"
#include "cuda/common/tma.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/common/wgmma_attn.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

#if defined(GPUKIT_SM90A) && GPUKIT_SM90A
namespace {
using namespace sm90;

constexpr int kCons = 2;  // consumer warpgroups

template <int D, int ST>  // ST: K / V pipeline stages
struct CfgWS {
  static constexpr int BM = 64 * kCons;
  static constexpr int BN = D == 256 ? 64 : 128;
  static constexpr int Q_BYTES = BM * D * 2;
  static constexpr int KV_BYTES = BN * D * 2;
  static constexpr int SMEM = Q_BYTES + 2 * ST * KV_BYTES + 1024;  // K, V x ST stages; + alignment slack
  static constexpr int THREADS = 128 * (kCons + 1);
};

template <bool BF16, int D, bool PP, int ST>
__global__ void __launch_bounds__(CfgWS<D, ST>::THREADS, 1)
    k_prefill_ws(const __grid_constant__ PrefillArgs a, const __grid_constant__ CUtensorMap tq,
                 const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = CfgWS<D, ST>;
  constexpr int BM = C::BM, BN = C::BN, NCB = D / 64;
  extern __shared__ char smem_raw[];
  __shared__ int sh_find[2];
  // q_full, k_full[ST], v_full[ST], k_empty[ST], v_empty[ST]
  __shared__ __align__(8) uint64_t bars[1 + 4 * ST];
  const uint32_t sbase = (uint32_t(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  const uint32_t sQ = sbase;
  auto sK = [&](int s) { return sbase + C::Q_BYTES + s * C::KV_BYTES; };
  auto sV = [&](int s) { return sbase + C::Q_BYTES + (ST + s) * C::KV_BYTES; };
  const uint32_t b0 = uint32_t(__cvta_generic_to_shared(bars));
  const uint32_t q_full = b0;
  auto k_full = [&](int s) { return b0 + 8u * (1 + s); };
  auto v_full = [&](int s) { return b0 + 8u * (1 + ST + s); };
  auto k_empty = [&](int s) { return b0 + 8u * (1 + 2 * ST + s); };
  auto v_empty = [&](int s) { return b0 + 8u * (1 + 3 * ST + s); };
  // Tile it uses stage it % ST for the (it / ST)-th time: barrier phase parity (it / ST) & 1.
  auto stage = [](int it) { return it % ST; };
  auto par = [](int it) { return uint32_t(it / ST) & 1u; };

  const int h = blockIdx.x, tid = threadIdx.x;
  SeqTile t;
  if (!find_tile<BM>(a, int(blockIdx.y), t, sh_find)) return;
  const int kvh = h / (a.hq / a.hkv);
  const int wg = tid / 128, lane = tid & 31;

  const RowRange rr{t.Lk - t.Lq, t.Lk, a.window, a.causal};
  const int64_t mlast = min(int64_t(t.m0) + BM, t.Lq) - 1;
  const int kv_lo = rr.lo(t.m0), kv_hi = rr.hi(mlast);
  const int hi_first = rr.hi(t.m0), lo_last = rr.lo(mlast);
  const int n_begin = kv_hi > kv_lo ? kv_lo / BN : 0;
  const int n_end = kv_hi > kv_lo ? (kv_hi + BN - 1) / BN : 0;
  const int ntiles = n_end - n_begin;

  if (tid == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < ST; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), 4 * kCons);  // one arrival per consumer warp
      mbar_init(v_empty(s), 4 * kCons);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {  // ---- producer ----
    setmaxnreg_dec<24>();
    if (tid == 0) {
      mbar_expect_tx(q_full, C::Q_BYTES);
#pragma unroll
      for (int c = 0; c < NCB; ++c) tma_load_3d(sQ + c * (BM * 128), &tq, q_full, 64 * c, h, int(t.q0 + t.m0));
      for (int it = 0; it < ntiles; ++it) {
        const int s = stage(it);
        const int row = int(t.k0 + int64_t(n_begin + it) * BN);
        if (it >= ST) mbar_wait(k_empty(s), par(it - ST));
        mbar_expect_tx(k_full(s), C::KV_BYTES);
#pragma unroll
        for (int c = 0; c < NCB; ++c) tma_load_3d(sK(s) + c * (BN * 128), &tk, k_full(s), 64 * c, kvh, row);
        if (it >= ST) mbar_wait(v_empty(s), par(it - ST));
        mbar_expect_tx(v_full(s), C::KV_BYTES);
#pragma unroll
        for (int c = 0; c < NCB; ++c) tma_load_3d(sV(s) + c * (BN * 128), &tv, v_full(s), 64 * c, kvh, row);
      }
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<240>();
  const int cw = wg - 1, warp = (tid % 128) / 32;
  const int64_t r0 = t.m0 + cw * 64 + warp * 16 + lane / 4, r1 = r0 + 8;
  const int cq = 2 * (lane & 3);
  const int lo0 = rr.lo(r0), lo1 = rr.lo(r1), hi0 = rr.hi(r0), hi1 = rr.hi(r1);
  const SoftmaxParams sp(a);
  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  RowState st;
  uint32_t pa[BN / 16][4];

  auto issue_s = [&](float (&p)[BN / 2], int s) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint64_t dq = smem_desc(sQ + (kk / 4) * (BM * 128) + cw * (64 * 128) + (kk % 4) * 32, 16, 1024);
      const uint64_t dk = smem_desc(sK(s) + (kk / 4) * (BN * 128) + (kk % 4) * 32, 16, 1024);
      mma_ss<BN, BF16>(p, dq, dk, kk > 0);
    }
  };
  auto issue_pv = [&](int s) {
#pragma unroll
    for (int j = 0; j < BN / 16; ++j) {
      const uint64_t dv = smem_desc(sV(s) + j * (16 * 128), BN * 128, 1024);
      mma_rs_mn<D, BF16>(o, pa[j], dv, 1);
    }
  };
  auto release = [&](uint32_t bar) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  };
  // Ping-pong (PP): the two consumer warpgroups take turns issuing their products
  // (named barriers 1 and 2, 256 threads: one warpgroup waits, the other arrives),
  // so that one's softmax runs while the other's products use the tensor cores.
  // Warpgroup 1 opens; every issue point is followed by a signal to the other,
  // except warpgroup 1's last, so each barrier sees as many arrivals as waits.
  auto turn_wait = [&] {
    if constexpr (PP) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + cw) : "memory");
  };
  auto turn_pass = [&](bool last) {
    if constexpr (PP)
      if (!(last && cw == 1)) asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - cw) : "memory");
  };

  mbar_wait(q_full, 0);
  if (ntiles > 0) {
    if constexpr (PP)
      if (cw == 1) asm volatile("bar.arrive 1, 256;\n" ::: "memory");  // warpgroup 0 goes first
    {  // first tile: S_0 alone
      float p[BN / 2];
      mbar_wait(k_full(0), 0);
      turn_wait();
      wg_fence();
      issue_s(p, 0);
      wg_commit();
      turn_pass(false);
      wg_wait<0>();
      fence_regs(p);
      release(k_empty(0));
      const int j0 = n_begin * BN;
      float al0, al1;
      softmax_step<BN>(p, st, sp, j0 + BN > hi_first || j0 < lo_last, j0, cq, lo0, hi0, lo1, hi1, al0, al1);
      to_a_frags<BN, BF16>(p, pa);  // O is still zero: no rescale
    }
    for (int it = 1; it < ntiles; ++it) {
      const int s = stage(it), ps = stage(it - 1);
      float p[BN / 2];
      mbar_wait(k_full(s), par(it));
      mbar_wait(v_full(ps), par(it - 1));
      turn_wait();
      wg_fence();
      issue_s(p, s);
      wg_commit();
      issue_pv(ps);  // O += P_{n-1} V_{n-1} runs while the softmax of S_n does
      wg_commit();
      turn_pass(false);
      wg_wait<1>();
      fence_regs(p);
      release(k_empty(s));
      const int j0 = (n_begin + it) * BN;
      float al0, al1;
      softmax_step<BN>(p, st, sp, j0 + BN > hi_first || j0 < lo_last, j0, cq, lo0, hi0, lo1, hi1, al0, al1);
      wg_wait<0>();
      fence_regs(o);
      release(v_empty(ps));
      rescale(o, al0, al1);
      to_a_frags<BN, BF16>(p, pa);
    }
    const int ls = stage(ntiles - 1);
    mbar_wait(v_full(ls), par(ntiles - 1));
    turn_wait();
    wg_fence();
    issue_pv(ls);
    wg_commit();
    turn_pass(true);
    wg_wait<0>();
    fence_regs(o);
  }
  uint16_t* og = static_cast<uint16_t*>(a.out) + (t.q0 * a.hq + h) * int64_t(D);
  store_rows<D, BF16>(o, st, og, int64_t(a.hq) * D, r0, t.Lq, cq);
  (void)r1;
#else
  __trap();  // launched only when sm_90a code was built (GPUKIT_SM90A)
#endif
}

template <bool BF16, int D, int ST>
bool launch_ws(const PrefillArgs& a, unsigned ny, bool pp, cudaStream_t st) {
  using C = CfgWS<D, ST>;
  CUtensorMap mq, mk, mv;
  const uint64_t e = 2;  // bytes per element
  if (!make_tmap_3d(&mq, a.q, BF16, D, uint64_t(a.hq), uint64_t(a.Tq), a.q_hs * e, a.q_ts * e, 64, 1, C::BM) ||
      !make_tmap_3d(&mk, a.k, BF16, D, uint64_t(a.hkv), uint64_t(a.Tk), a.k_hs * e, a.k_ts * e, 64, 1, C::BN) ||
      !make_tmap_3d(&mv, a.v, BF16, D, uint64_t(a.hkv), uint64_t(a.Tk), a.v_hs * e, a.v_ts * e, 64, 1, C::BN))
    return false;
  auto kern = pp ? k_prefill_ws<BF16, D, true, ST> : k_prefill_ws<BF16, D, false, ST>;
  GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
  dim3 grid{unsigned(a.hq), ny, 1u};
  kern<<<grid, C::THREADS, C::SMEM, st>>>(a, mq, mk, mv);
  GK_LAUNCH_CHECK("attention_prefill_sm90_ws");
  return true;
}
}  // namespace
#endif

// The warp-specialized TMA kernel (pingpong: the consumer warpgroups take turns
// on the tensor cores; stages: 2 or 3 K/V buffers, 3 only for head_dim <= 128);
// the caller has checked the device (sm_90),
// dtype, head_dim and 16-byte alignment. false: not applicable (tensor maps
// rejected, e.g. zero-size or over-large dims), the caller falls back.
bool attention_prefill_sm90_ws(const PrefillArgs& a, bool pingpong, int stages, void* stream) {
#if defined(GPUKIT_SM90A) && GPUKIT_SM90A
  constexpr int BM = 64 * kCons;
  if (a.Tq <= 0 || a.Tk <= 0 || a.Tq > INT32_MAX || a.Tk > INT32_MAX) return false;
  if (a.q_ts <= 0 || a.q_hs <= 0 || a.k_ts <= 0 || a.k_hs <= 0 || a.v_ts <= 0 || a.v_hs <= 0) return false;
  const int64_t ny = (a.Tq + BM - 1) / BM + (a.cu_q ? a.B : 0);
  if (ny > 65535 || a.hq > 65535) return false;
  auto st = static_cast<cudaStream_t>(stream);
  const bool bf = a.dtype == DType::bf16;
  const unsigned y = unsigned(ny);
  const bool three = stages == 3;  // 3 stages fit in shared memory for head_dim 64 and 128
  switch (a.D) {
    case 64:
      if (three) return bf ? launch_ws<true, 64, 3>(a, y, pingpong, st) : launch_ws<false, 64, 3>(a, y, pingpong, st);
      return bf ? launch_ws<true, 64, 2>(a, y, pingpong, st) : launch_ws<false, 64, 2>(a, y, pingpong, st);
    case 128:
      if (three) return bf ? launch_ws<true, 128, 3>(a, y, pingpong, st) : launch_ws<false, 128, 3>(a, y, pingpong, st);
      return bf ? launch_ws<true, 128, 2>(a, y, pingpong, st) : launch_ws<false, 128, 2>(a, y, pingpong, st);
    case 256: return bf ? launch_ws<true, 256, 2>(a, y, pingpong, st) : launch_ws<false, 256, 2>(a, y, pingpong, st);
    default: return false;
  }
#else
  (void)a;
  (void)pingpong;
  (void)stages;
  (void)stream;
  return false;
#endif
}

}  // namespace gk::cuda
