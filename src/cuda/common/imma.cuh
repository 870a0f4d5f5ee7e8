// mma.sync.m16n8k32 on 8-bit integers (u8 / s8 operands, s32 accumulators; exact): d += a (16 x 32, row) b (32 x 8,
// col). Lane (g, t) = (lane / 4, lane % 4) holds a[0] = (row g, k 4t..4t+3), a[1] = (row g + 8, the same k),
// a[2] = (row g, k 16+4t..), a[3] = (row g + 8, k 16+4t..); b0 = (k 4t.., column g), b1 = (k 16+4t.., column g);
// d[0], d[1] = (row g, columns 2t, 2t + 1), d[2], d[3] = (row g + 8, the same columns).
// Used by the int4 g128 GEMV (gemv_w4i.cuh: u8 codes) and the GGUF integer GEMV (quant_gguf_imma.cu).
#pragma once
#include <cstdint>

namespace gk::cuda::gemv_detail {

#define GK_IMMA_FN(NAME, AT, BT)                                                                                     \
  __device__ __forceinline__ void NAME(int32_t(&d)[4], const uint32_t(&a)[4], uint32_t b0, uint32_t b1) {           \
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32." AT "." BT ".s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "     \
                 "{%8, %9}, {%0, %1, %2, %3};"                                                                       \
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])                                                    \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                                    \
  }
GK_IMMA_FN(imma_us, "u8", "s8")
GK_IMMA_FN(imma_uu, "u8", "u8")
GK_IMMA_FN(imma_ss, "s8", "s8")
GK_IMMA_FN(imma_su, "s8", "u8")
#undef GK_IMMA_FN

__device__ __forceinline__ uint32_t w4i_umax2(uint32_t a, uint32_t b) {  // per 16-bit half, unsigned
  uint32_t r;
  asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

}  // namespace gk::cuda::gemv_detail
