// Hand-written PTX wrappers for Hopper warpgroup MMA (wgmma, sm_90a only).
//
// Shared-memory operands use 128-byte-swizzled tiles: a tile of R rows and C
// 16-bit columns is stored as C/64 column blocks of R rows x 128 bytes; inside a
// block, the 16-byte chunk c of row r sits at chunk (c ^ (r % 8)). Block bases
// are 1024-byte aligned. smem_desc() builds the matrix descriptor for such a
// tile (layout type 1 = 128B swizzle):
//  - K-major operand (rows = M or N, K contiguous): sbo = 1024 (8-row groups),
//    lbo unused (16); the k-th 16-element step inside a block adds 32*k bytes.
//  - MN-major operand (rows = K, MN contiguous): sbo = 1024 (8-row groups along
//    K), lbo = R*128 (stride between 64-element column blocks along MN).
// Accumulator fragment of m64nNk16 (fp32), thread t of the warpgroup, lane
// l = t % 32: d[4i + 2h + e] holds row 16*(t/32) + l/4 + 8h, column 8i + 2*(l%4) + e.
// The register A fragment (16-bit) of one k16 step uses the same mapping with
// pairs packed: a[0] = (row, k 2c..2c+1), a[1] = (row+8, ..), a[2] = (row, k+8), a[3] = (row+8, k+8).
//
// The specializations are stamped out by GK_WG_MMA_SS / GK_WG_MMA_RS from one pattern each
// (shape N, input type); src/cuda/common/wgmma_gemm.cuh stamps the GEMM-only shapes.
#pragma once
#include <cstdint>

namespace gk::cuda::sm90 {

__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= uint64_t((addr & 0x3FFFF) >> 4);
  d |= uint64_t((lbo & 0x3FFFF) >> 4) << 16;
  d |= uint64_t((sbo & 0x3FFFF) >> 4) << 32;
  d |= uint64_t(1) << 62;  // 128-byte swizzle
  return d;
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Ties registers to this point so the compiler keeps reads/writes of wgmma
// accumulators on the right side of fences and waits.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// Accumulator operands d[b .. b + 8) of an inline wgmma (fp32, read-write) and the
// "%0, %1, ..." register lists of the first 32 / 64 / 128 operands.
#define GK_WG_D8(b)                                                                                       \
  "+f"(d[(b)]), "+f"(d[(b) + 1]), "+f"(d[(b) + 2]), "+f"(d[(b) + 3]), "+f"(d[(b) + 4]), "+f"(d[(b) + 5]), \
      "+f"(d[(b) + 6]), "+f"(d[(b) + 7])
#define GK_WG_D32 GK_WG_D8(0), GK_WG_D8(8), GK_WG_D8(16), GK_WG_D8(24)
#define GK_WG_D64 GK_WG_D32, GK_WG_D8(32), GK_WG_D8(40), GK_WG_D8(48), GK_WG_D8(56)
#define GK_WG_D128                                                                                               \
  GK_WG_D64, GK_WG_D8(64), GK_WG_D8(72), GK_WG_D8(80), GK_WG_D8(88), GK_WG_D8(96), GK_WG_D8(104), GK_WG_D8(112), \
      GK_WG_D8(120)
#define GK_WG_R32                                                        \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" \
  ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define GK_WG_R64                                                                    \
  GK_WG_R32                                                                          \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" \
  ", %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define GK_WG_R128                                                                               \
  GK_WG_R64                                                                                      \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"             \
  ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"             \
  ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111" \
  ", %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// D (64 x N, fp32) (+)= A (64 x 16, smem, K-major) * B (16 x N, smem, K-major).
template <int N, bool BF16>
__device__ __forceinline__ void mma_ss(float (&d)[N / 2], uint64_t da, uint64_t db, int acc);
// D (64 x N, fp32) (+)= A (64 x 16, registers) * B (16 x N, smem, MN-major).
template <int N, bool BF16>
__device__ __forceinline__ void mma_rs_mn(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db, int acc);

// One specialization of mma_ss / mma_rs_mn: shape N (accumulators D = GK_WG_D<N/2>, register
// list R = GK_WG_R<N/2>), input type TY ("bf16" / "f16", BF16 = true / false). DA, DB, P: the
// operand numbers of the descriptors (ss) or the first A register and B's descriptor (rs),
// and of the accumulate flag (the operands after the N / 2 accumulators).
#define GK_WG_MMA_SS(N, BF16, TY, D, R, DA, DB, P)                                                       \
  template <>                                                                                            \
  __device__ __forceinline__ void mma_ss<N, BF16>(float(&d)[N / 2], uint64_t da, uint64_t db, int acc) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                                        \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " "                         \
                 "{" R "}, %" #DA ", %" #DB ", p, 1, 1, 0, 0;\n}\n"                                      \
                 : D                                                                                     \
                 : "l"(da), "l"(db), "r"(acc));                                                          \
  }
#define GK_WG_MMA_RS(N, BF16, TY, D, R, A0, A1, A2, A3, DB, P)                                             \
  template <>                                                                                              \
  __device__ __forceinline__ void mma_rs_mn<N, BF16>(float(&d)[N / 2], const uint32_t(&a)[4], uint64_t db, \
                                                     int acc) {                                            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                                          \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " "                           \
                 "{" R "}, {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #DB ", p, 1, 1, 1;\n}\n"           \
                 : D                                                                                       \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));                         \
  }

GK_WG_MMA_SS(64, true, "bf16", GK_WG_D32, GK_WG_R32, 32, 33, 34)
GK_WG_MMA_SS(128, true, "bf16", GK_WG_D64, GK_WG_R64, 64, 65, 66)
GK_WG_MMA_RS(64, true, "bf16", GK_WG_D32, GK_WG_R32, 32, 33, 34, 35, 36, 37)
GK_WG_MMA_RS(128, true, "bf16", GK_WG_D64, GK_WG_R64, 64, 65, 66, 67, 68, 69)
GK_WG_MMA_RS(256, true, "bf16", GK_WG_D128, GK_WG_R128, 128, 129, 130, 131, 132, 133)
GK_WG_MMA_SS(64, false, "f16", GK_WG_D32, GK_WG_R32, 32, 33, 34)
GK_WG_MMA_SS(128, false, "f16", GK_WG_D64, GK_WG_R64, 64, 65, 66)
GK_WG_MMA_RS(64, false, "f16", GK_WG_D32, GK_WG_R32, 32, 33, 34, 35, 36, 37)
GK_WG_MMA_RS(128, false, "f16", GK_WG_D64, GK_WG_R64, 64, 65, 66, 67, 68, 69)
GK_WG_MMA_RS(256, false, "f16", GK_WG_D128, GK_WG_R128, 128, 129, 130, 131, 132, 133)

}  // namespace gk::cuda::sm90
