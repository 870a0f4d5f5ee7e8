// Pieces shared by the tensor-core decode-attention kernels (attention_decode_mma.cu,
// attention_decode_fold.cu): the per-warp stage layout, mma.sync / ldmatrix wrappers, the
// shared-memory swizzle and the SM count.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <cstdint>
#include <type_traits>

#include "core/cuda_util.h"
#include "cuda/common/rows.cuh"

namespace gk::cuda::dmma {

constexpr unsigned kFull = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;

// W warps per CTA and S stages per warp: 0 = the defaults below (other values: tuning variants).
template <int D, int W_ = 0, int S_ = 0>
struct MCfg {
  static constexpr int ROWB = D * 2;             // bytes of one head row
  static constexpr int CH = ROWB / 16;           // 16-byte chunks per row (8, 16, 32)
  static constexpr int TK = 16;                  // keys per stage
  static constexpr int KVB = TK * ROWB;          // bytes of the K (or V) tile of a stage
  static constexpr int QB = 8 * ROWB;            // a query slot: 8 heads
  static constexpr int STAGE = 2 * KVB;
  static constexpr int W = W_ ? W_ : D == 256 ? 4 : 8;  // warps per CTA (two per scheduler: latency hiding)
  static constexpr int S = S_ ? S_ : D == 64 ? 5 : 3;   // stages per warp
  // Query slots per warp, used round-robin by the warp's items: the copies of an item's queries are
  // issued at most S - 1 tiles (so S - 1 items) ahead of their use, after the use of the slot's last item.
  static constexpr int NQ = S > 2 ? S - 1 : 1;
  static constexpr int WARPB = S * STAGE + NQ * QB;  // shared memory of one warp
  static constexpr int CPL = TK * CH / 32;       // K (and V) copies per lane per stage
  static constexpr int QPL = 8 * CH / 32;        // query copies per lane
  static constexpr int KSTEP = D / 16;
  static constexpr size_t SMEM = size_t(W) * WARPB;
  static_assert(SMEM <= 227 * 1024, "shared memory of one CTA");
};

// 2^x on the SFU (one instruction; +0 for -inf): the softmax weights and rescalings.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ int swz(int r, int c, int rowb) { return r * rowb + ((c ^ (r & 7)) << 4); }

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <class T>
__device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<T, bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, bf16>) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// Programmatic dependent launch (PDL). griddepcontrol.wait: every kernel this one depends on has
// completed and its writes are visible (a no-op without the launch attribute); launch_dependents: the next
// kernel of the stream may start launching (it waits for this grid's completion before reading its results).
// Every decode kernel waits before its first global access (read or write) and triggers right after, so a
// grid's completion implies the completion of the grids before it.
__device__ __forceinline__ void gdc_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void gdc_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Whether the first decode kernel of a call launches with the programmatic-stream-serialization attribute
// (it may then start while the previous kernel of the stream finishes): sm_90+, GPUKIT_PDL not "0" (read
// once, as the engine) and GPUKIT_DECODE_PDL not "0" (read at each call: benchmarks compare both).
inline bool decode_pdl() {
  static const bool env_on = [] {
    const char* e = std::getenv("GPUKIT_PDL");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  if (!env_on) return false;
  const char* e = std::getenv("GPUKIT_DECODE_PDL");
  if (e && std::strcmp(e, "0") == 0) return false;
  static std::atomic<int> major[64];
  int dev = 0;
  GK_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) dev = 0;
  int m = major[dev].load(std::memory_order_relaxed);
  if (m <= 0) {
    GK_CUDA_CHECK(cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, dev));
    major[dev].store(m, std::memory_order_relaxed);
  }
  return m >= 9;
}

// Launches kernel k, with the PDL attribute when pdl (a plain launch where that is refused).
template <class... P, class... A>
void launch_maybe_pdl(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, bool pdl, A... args) {
  if (pdl) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cudaLaunchKernelEx(&cfg, k, args...) == cudaSuccess) return;
    (void)cudaGetLastError();
  }
  k<<<grid, block, smem, st>>>(args...);
}

inline int sm_count() {
  static std::atomic<int> cache[64];
  int dev = 0;
  GK_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) dev = 0;
  int n = cache[dev].load(std::memory_order_relaxed);
  if (n <= 0) {
    GK_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    cache[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

// Zeroed int32 counters for in-kernel merges (the last CTA of a count merges), at least n, left zeroed by the
// kernels.
// One buffer per (device, stream) for direct launches and one per (device, stream, capture) while a graph is
// captured, so that launches which may run concurrently never share counters (buffers are kept for the
// process: a few KB each). Allocated and zeroed through a private stream, synchronized (once per buffer).
inline int* merge_counters(cudaStream_t st, int64_t n) {
  static std::mutex mu;
  static std::map<std::tuple<int, cudaStream_t, unsigned long long>, std::pair<int*, int64_t>> bufs;
  int dev = 0;
  GK_CUDA_CHECK(cudaGetDevice(&dev));
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  GK_CUDA_CHECK(cudaStreamGetCaptureInfo(st, &cs, &id));
  if (cs == cudaStreamCaptureStatusInvalidated) return nullptr;
  if (cs == cudaStreamCaptureStatusNone) id = 0;
  std::lock_guard<std::mutex> lk(mu);
  auto& e = bufs[{dev, st, id}];
  if (e.first && e.second >= n) return e.first;
  const int64_t cap = std::max<int64_t>(n, 1024);
  int* p = nullptr;
  GK_CUDA_CHECK(cudaMalloc(&p, size_t(cap) * sizeof(int)));
  cudaStream_t z = nullptr;
  GK_CUDA_CHECK(cudaStreamCreateWithFlags(&z, cudaStreamNonBlocking));
  GK_CUDA_CHECK(cudaMemsetAsync(p, 0, size_t(cap) * sizeof(int), z));
  GK_CUDA_CHECK(cudaStreamSynchronize(z));
  GK_CUDA_CHECK(cudaStreamDestroy(z));
  e = {p, cap};  // a smaller buffer it replaces may still be used by queued launches: kept
  return p;
}

}  // namespace gk::cuda::dmma
