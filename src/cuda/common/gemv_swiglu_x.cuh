// The down projection's x made inside its GEMV from the gate/up product (EngineOptions::
// fused_swiglu_x; session 9): instead of the engine's SwiGLU launch (k_swiglu of
// src/cuda/llm_small.cu) writing x = silu(gate) * up and the quantized GEMV reading it, the
// GEMV reads gu [1, 2K] (gate then up, the gate/up GEMV's output) after its PDL wait and computes
// each x element with k_swiglu's expression (gated_fn<SwiGLU, float> of the bf16 values, then
// convert<bf16>: the same fp32 operations, the same library expf and IEEE divide, the same
// rounding), so the B operands are the bits the SwiGLU kernel would have written and the sums
// are the unfused GEMV's.
// - k_w8 (common/gemv_w8.cuh) XM 3 (fp8 / int8 codes decoded to exact bf16, B = bf16 x; the
//   8-bit default): each warp's stage of 4 blocks needs 256 elements of x; lane l computes
//   elements 8 l .. 8 l + 7 (one 16-byte gate load and one up load, issued a stage ahead) and
//   stores them into a per-warp ring in shared memory (XR's ring, bf16 instead of scaled fp16),
//   from which the fragment lanes read their B words as XR's do. So every element is computed
//   once per warp and CTA (K per CTA in all), by all 32 lanes, not only the 4 lanes of x row 0.
// - k_w4 (common/gemv_w4.cuh) MODE 15 (int4 g128, bf16 x, M = 1: MODE 11 = variant 48's kernel,
//   the default; gemv_swiglu_x_w4.cuh): MODE 11 copies each stage's x with its codes and pairs it
//   in place once the stage has landed; MODE 15 loads the stage's gate and up a stage ahead into
//   registers (2 chunks per lane) and, before waiting for the stage's codes, makes x, pairs it the
//   same way and stores it where MODE 11's copy lies: the silu work overlaps the codes' flight.
// M = 1 only (the host checks; elsewhere the engine keeps the SwiGLU launch).
#pragma once
#include "gemv.cuh"
#include "ops/nn_args.h"

namespace gk::cuda::gemv_detail {

// x of one (gate, up) pair of bf16 words (2 elements each): k_swiglu's arithmetic, element by
// element, as a bf16 pair.
__device__ __forceinline__ uint32_t sgx_x2(uint32_t g2, uint32_t u2) {
  const bf16 g0 = bf16::from_bits(uint16_t(g2 & 0xffffu)), g1 = bf16::from_bits(uint16_t(g2 >> 16));
  const bf16 u0 = bf16::from_bits(uint16_t(u2 & 0xffffu)), u1 = bf16::from_bits(uint16_t(u2 >> 16));
  const bf16 x0 = convert<bf16>(gated_fn<nn::GatedAct::SwiGLU, float>(float(g0), float(u0)));
  const bf16 x1 = convert<bf16>(gated_fn<nn::GatedAct::SwiGLU, float>(float(g1), float(u1)));
  return uint32_t(x0.bits) | (uint32_t(x1.bits) << 16);
}

// 8 elements of x from 16 bytes of gate and 16 bytes of up.
__device__ __forceinline__ uint4 sgx_x8(const uint4& g, const uint4& u) {
  return make_uint4(sgx_x2(g.x, u.x), sgx_x2(g.y, u.y), sgx_x2(g.z, u.z), sgx_x2(g.w, u.w));
}

// k_w8 XM 3: a warp's x ring (one row, M = 1), filled stage by stage. p.x: gu row 0 (bf16, gate
// at element j, up at p.k + j, 16-byte aligned); the warp's blocks b0 .. b1 (64 elements each).
// A stage of KB = 4 blocks is 256 elements: lane l's are 8 l .. 8 l + 7 of the stage.
struct W8SgxRing {
  const bf16* gu = nullptr;
  int64_t k = 0;
  int64_t next = 0, end = 0;  // the element of the next stage to load; b1 * 64
  uint4 gn, un;               // the lane's gate / up chunk of the stage to fill next

  __device__ __forceinline__ void load(int lane) {
    gn = un = make_uint4(0, 0, 0, 0);
    const int64_t e = next + 8 * lane;
    if (e < end) {
      gn = __ldg(reinterpret_cast<const uint4*>(gu + e));
      un = __ldg(reinterpret_cast<const uint4*>(gu + k + e));
    }
    next += 256;
  }
  // after the PDL wait: the first stage's gate and up
  __device__ __forceinline__ void init(const KArgs& p, int64_t b0, int64_t b1, int lane) {
    gu = static_cast<const bf16*>(p.x);
    k = p.k;
    next = b0 * 64;
    end = b1 * 64;
    load(lane);
  }
  // the loaded stage's x into the ring slot at `slot` (the row's 256 elements, 16 bytes per lane),
  // then the next stage's gate and up loaded; the caller syncs the warp before the fragment reads
  __device__ __forceinline__ void fill(uint32_t slot, int lane) {
    const uint4 x = sgx_x8(gn, un);
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(slot + uint32_t(lane * 16)), "r"(x.x), "r"(x.y),
                 "r"(x.z), "r"(x.w));
    load(lane);
  }
};

}  // namespace gk::cuda::gemv_detail
