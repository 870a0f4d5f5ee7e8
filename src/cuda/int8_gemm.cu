// gpukit's tensor-core int8 GEMM: C[M, N] (int32, exact) = A[M, K] @ W[N, K]^T with both
// operands K-contiguous ("TN"), through mma.sync m16n8k32 s8 x s8 -> s32.
//
// A block of 256 threads (8 warps as 2 x 4) owns a 128 x 128 tile of C; each warp a
// 64 x 32 part: 4 x 4 MMA tiles of 16 x 8, 64 int32 accumulators per thread. K is
// walked 64 bytes at a time through two shared-memory stages filled by cp.async (16-byte
// copies, zero-filled past the edges) while the other stage feeds ldmatrix + mma. Rows
// are padded to 80 bytes so that the 8 row addresses of an ldmatrix hit 8 different
// 16-byte bank groups. Integer sums are exact: any order gives the same bits.
//
// Requirements (else the caller uses another path): K, the row strides of A and W a
// multiple of 16 bytes, 16-byte aligned A and W, C rows contiguous.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_util.h"
#include "cuda/common/mma_sync_ld.cuh"
#include "ops/gemm.h"

namespace gk::cuda {

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 64, kPad = 80, kThreads = 256;
constexpr unsigned kMaxGridY = 65535;

using tc::cp_async16;
using tc::ldmatrix_x4;

__device__ __forceinline__ void mma_s8(int32_t (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__global__ void __launch_bounds__(kThreads) k_int8_mma(const int8_t* __restrict__ A, const int8_t* __restrict__ W,
                                                       int32_t* __restrict__ C, int64_t m, int64_t n, int64_t k,
                                                       int64_t lda, int64_t ldw, int64_t ldc) {
  __shared__ __align__(128) int8_t As[2][kBM * kPad];
  __shared__ __align__(128) int8_t Ws[2][kBN * kPad];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / 4, wn = warp % 4;  // the warp's rows wm*64.., columns wn*32..
  const int64_t col0 = int64_t(blockIdx.x) * kBN;
  const int64_t nk = (k + kBK - 1) / kBK;
  for (int64_t row0 = int64_t(blockIdx.y) * kBM; row0 < m; row0 += int64_t(gridDim.y) * kBM) {
    int32_t acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][j][q] = 0;

    auto load = [&](int stage, int64_t k0) {
#pragma unroll
      for (int u = 0; u < 2; ++u) {  // 128 rows x 64 bytes = 512 chunks of 16 bytes, per operand
        const int c = tid + u * kThreads, r = c / 4, kb = (c % 4) * 16;
        const int64_t gk = k0 + kb, ga = row0 + r, gw = col0 + r;
        const bool va = ga < m && gk < k, vw = gw < n && gk < k;
        cp_async16(&As[stage][r * kPad + kb], va ? A + ga * lda + gk : A, va);
        cp_async16(&Ws[stage][r * kPad + kb], vw ? W + gw * ldw + gk : W, vw);
      }
      asm volatile("cp.async.commit_group;\n" ::);
    };

    load(0, 0);
    for (int64_t kt = 0; kt < nk; ++kt) {
      const int st = int(kt & 1);
      if (kt + 1 < nk) {
        load(st ^ 1, (kt + 1) * kBK);
        asm volatile("cp.async.wait_group 1;\n" ::);
      } else {
        asm volatile("cp.async.wait_group 0;\n" ::);
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 32) {
        uint32_t af[4][4], bf[2][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // rows wm*64 + 16i + (lane % 16), bytes kk + 16 * (lane / 16)
          const int r = wm * 64 + i * 16 + (lane % 16), b = kk + 16 * (lane / 16);
          ldmatrix_x4(af[i], &As[st][r * kPad + b]);
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {  // two 8-column tiles per x4: (n lo, k lo), (n lo, k hi), (n hi, k lo), (n hi, k hi)
          const int r = wn * 32 + j * 16 + (lane % 8) + 8 * (lane / 16), b = kk + 16 * ((lane / 8) % 2);
          ldmatrix_x4(bf[j], &Ws[st][r * kPad + b]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) mma_s8(acc[i][j], af[i], bf[j / 2][(j % 2) * 2], bf[j / 2][(j % 2) * 2 + 1]);
      }
      __syncthreads();
    }
    // c0, c1: row lane/4, columns 2*(lane%4) + {0, 1}; c2, c3: row lane/4 + 8
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t r = row0 + wm * 64 + i * 16 + lane / 4 + 8 * h;
          const int64_t c = col0 + wn * 32 + j * 8 + 2 * (lane % 4);
          if (r >= m) continue;
          if (c < n) C[r * ldc + c] = acc[i][j][2 * h];
          if (c + 1 < n) C[r * ldc + c + 1] = acc[i][j][2 * h + 1];
        }
  }
}

}  // namespace

bool int8_gemm_mma(const MatmulArgs& p, void* stream) {
  // A [m, k] rows a_rs apart; B = W^T with W [n, k] rows b_cs apart; C rows c_rs apart.
  if (p.batch != 1 || p.m <= 0 || p.n <= 0 || p.k <= 0) return false;
  if (p.a_cs != 1 && p.k != 1) return false;
  if (p.b_rs != 1 && p.k != 1) return false;
  if (p.c_cs != 1) return false;
  const int64_t lda = p.m == 1 ? p.k : p.a_rs, ldw = p.n == 1 ? p.k : p.b_cs;
  if (p.k % 16 || lda % 16 || ldw % 16) return false;
  if (reinterpret_cast<uintptr_t>(p.a) % 16 || reinterpret_cast<uintptr_t>(p.b) % 16) return false;
  const int64_t gx = (p.n + kBN - 1) / kBN, gy = (p.m + kBM - 1) / kBM;
  if (gx > int64_t(INT32_MAX)) return false;
  dim3 grid(unsigned(gx), unsigned(std::min<int64_t>(gy, kMaxGridY)));
  k_int8_mma<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const int8_t*>(p.a), static_cast<const int8_t*>(p.b), static_cast<int32_t*>(p.c), p.m, p.n, p.k, lda,
      ldw, p.c_rs);
  GK_LAUNCH_CHECK("int8 GEMM (mma)");
  return true;
}

}  // namespace gk::cuda
