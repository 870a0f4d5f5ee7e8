// The staged 8-bit GEMV with the residual add + RMSNorm epilogue (EngineOptions::fused_norm_epilogue;
// k_w8's EPI in common/gemv_w8.cuh, common/gemv_norm_epi.cuh): the default configuration's kernels
// (weights decoded to exact bf16, 4 blocks per stage, a ring of 2 or the full ring of 2, one row tile)
// with EPI, launched by gemv_w8.cu's launch_w8_epi with its plan. In their own translation unit: the
// device compiler's code for gemv_w8.cu's other kernels changed with these instantiations beside them.
#include "common/gemv_norm_epi.cuh"
#include "common/gemv_w8.cuh"
#include "core/cuda_util.h"

namespace gk::cuda::gemv_detail {

struct KArgsEpi : KArgs {
  NormEpi epi;
  // the epilogue, by every thread of the CTA after its stores (y of dtype out, [m, n])
  __device__ __forceinline__ void tail(float* scratch) const { norm_epi::tail_any(epi, out, y, m, n, scratch); }
};

namespace {
constexpr int kSmemMax = 200 * 1024;  // gemv_w8.cu's kW8SmemMax
constexpr int64_t kSmSmem = 228 * 1024;

// gemv_w8.cu's launch_kd for one slice of K (the same shared memory sizing and spreading)
template <class F, bool FR>
void launch_epi(const KArgsEpi& p, int nw, cudaStream_t st, bool spread) {
  constexpr int SB = w8_stage_bytes(4, 1);
  smem_limit<k_w8<F, 4, 2, 1, 0, false, FR, true>>(kSmemMax);
  const int64_t blocks = (p.n + 15) / 16;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  int smem = nw * 2 * SB;
  if (smem > kSmemMax) throw ValueError("gemv: the staged kernel's shared memory does not fit");
  const int64_t per_sm = (blocks + 131) / 132;
  if (spread && per_sm >= 1 && per_sm <= 16) {
    const int64_t cap = kSmSmem / (per_sm + 1) - 1024 - 512 + 256;
    if (per_sm * (cap + 1024 + 512) <= kSmSmem && cap > smem) smem = int(std::min<int64_t>(cap, kSmemMax));
  }
  launch_ex(k_w8<F, 4, 2, 1, 0, false, FR, true>, dim3(unsigned(blocks), 1u), nw * 32, smem, st, p.variant != 2, p);
  GK_LAUNCH_CHECK("gemv_w8_epi");
}
}  // namespace

void w8_epi_launch(bool int8, bool fr, const KArgs& p, const NormEpi& e, int nw, cudaStream_t st, bool spread) {
  KArgsEpi a;
  static_cast<KArgs&>(a) = p;
  a.epi = e;
  if (int8) return fr ? launch_epi<SInt8B, true>(a, nw, st, spread) : launch_epi<SInt8B, false>(a, nw, st, spread);
  return fr ? launch_epi<SFp8B, true>(a, nw, st, spread) : launch_epi<SFp8B, false>(a, nw, st, spread);
}

}  // namespace gk::cuda::gemv_detail
