// k_w4 MODE 15 (EngineOptions::fused_swiglu_x, int4 g128 at M = 1; common/gemv_swiglu_x.cuh): the
// stage's x made by the warp from the gate/up product instead of copied. Each lane loads its NC
// 16-byte chunks of gate and of up of the next stage (one stage ahead, registers, through L1: the
// CTAs of an SM read the same gu), and at the stage's start, before waiting for the stage's codes,
// makes x = silu(gate) * up (k_swiglu's arithmetic), pairs it as MODE 11 pairs the copied x
// (w4_xpairs<false>) and stores it where MODE 11's copy of chunk j lies (chunk j ^ 2 ((j >> 3) & 1)
// of the stage's x area): the same B operands as MODE 11 on the SwiGLU kernel's output.
#pragma once
#include "gemv_swiglu_x.cuh"
#include "gemv_w4_ops.cuh"

namespace gk::cuda::gemv_detail {

template <int NC>  // x chunks per lane and stage (a stage of KB blocks: KB * 16 chunks)
struct W4SgxStage {
  const uint8_t* gu = nullptr;  // gate row (bf16); up 2 k bytes further
  int64_t up = 0;
  int64_t next = 0, end = 0;  // the chunk of the next stage to load; the warp's end (b1 * 16)
  uint4 g[NC], u[NC];

  __device__ __forceinline__ void load(int lane) {
#pragma unroll
    for (int i = 0; i < NC; ++i) {
      const int64_t c = next + lane + 32 * i;
      g[i] = u[i] = make_uint4(0, 0, 0, 0);
      if (c < end) {
        g[i] = __ldg(reinterpret_cast<const uint4*>(gu + 16 * c));
        u[i] = __ldg(reinterpret_cast<const uint4*>(gu + up + 16 * c));
      }
    }
    next += 32 * NC;
  }
  // after the PDL wait: the warp's blocks b0 .. b1 (128 elements each), the first stage's gate and up
  __device__ __forceinline__ void init(const void* x, int64_t k, int64_t b0, int64_t b1, int lane) {
    gu = static_cast<const uint8_t*>(x);
    up = 2 * k;
    next = b0 * 16;
    end = b1 * 16;
    load(lane);
  }
  // the loaded stage's x, paired, into the stage's x area xa; then the next stage's gate and up
  __device__ __forceinline__ void fill(uint32_t xa, int lane) {
#pragma unroll
    for (int i = 0; i < NC; ++i) {
      const int j = lane + 32 * i;
      uint4 o;
      w4_xpairs<false>(sgx_x8(g[i], u[i]), o.x, o.y, o.z, o.w);
      sts16(xa + uint32_t(16 * (j ^ (((j >> 3) & 1) << 1))), o);
    }
    load(lane);
  }
};

}  // namespace gk::cuda::gemv_detail
