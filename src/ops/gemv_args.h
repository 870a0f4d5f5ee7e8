// Argument block of the decode GEMV kernels (src/cpu/gemv.cpp, src/cuda/gemv.cu):
// y[m, j] = sum_k x[m, k] * w[j, k] for m < M <= 8, fp32 accumulation, rounded once.
#pragma once
#include <cstdint>
#include <vector>

#include "gpukit/dtype.h"

namespace gk {

struct GemvArgs {
  const void* x = nullptr;  // [m, k], dtype, row stride x_rs, elements contiguous
  const void* w = nullptr;  // [n, k], dtype, row stride w_rs, elements contiguous
  void* y = nullptr;        // [m, n] contiguous, out_dtype
  float* part = nullptr;    // CUDA split-K partial sums [split, m, n] (split > 1)
  int64_t m = 0, n = 0, k = 0, x_rs = 0, w_rs = 0;
  DType dtype = DType::bf16, out_dtype = DType::bf16;
  int split = 1;     // CUDA: slices of k summed by a second pass in slice order
  bool vec = false;  // CUDA: rows of x and w are 16-byte aligned (16-byte loads)
  bool mma = false;  // CUDA: the tensor-core kernel (vec and K % 32 == 0)
  int variant = 0;   // CUDA: kernel variant (gemv_set_variant)
  bool w8 = false;   // CUDA: the staged tensor-core kernel (src/cuda/gemv_w8.cu; vec and K % 32 == 0)
};

struct QGemvArgs;

// Which CUDA kernel reads bf16/fp16 (and fp8/int8) weights when several can: -1 the default
// (the staged kernel where it applies: K % 32 == 0 (bf16/fp16) or K % 64 == 0 (fp8/int8)
// and aligned rows; else the CUDA-core kernel), 0 the CUDA-core chunk kernel, 1 the per-lane tensor-core kernel
// (gemv_mma.cuh), 2 the staged tensor-core kernel (gemv_w8.cuh; a benchmarking switch;
// the choice never depends on M, so a row's bits do not depend on the batch).
void gemv_set_dense_path(int path);
int gemv_dense_path();
// Benchmarking switch of every GEMV kernel: 0 the default (launched with programmatic
// dependent launch: weights copied before waiting for the previous kernel), 1 a 2-stage
// cp.async ring (int4, Q8_0/Q4_0/Q4_1/Q4_K/Q6_K: the older kernels), 2 the default without
// programmatic dependent launch; 3..10: kernel variants of int4 / NVF4 / the GGUF formats
// (bench/gemv.py VARIANT_NAMES). Like the path, never a function of M.
void gemv_set_variant(int variant);
int gemv_variant();

namespace cpu {
void gemv(const GemvArgs& a);
}
namespace cuda {
void gemv(const GemvArgs& a, void* stream);
// The split-K factor the CUDA kernel uses for (n, k): a function of the shape only.
int gemv_split(int64_t n, int64_t k, bool mma);
// The staged tensor-core kernel (src/cuda/gemv_w8.cu): its split-K for rows of k weights of
// `ebytes` bytes; bf16/fp16 weights (GemvArgs with w8); fp8 / int8 weights (QGemvArgs with
// w8; bf16 x needs the workspaces xh [m, k] fp16 and xinv [m] f32).
int gemv_w8_split(int64_t n, int64_t k, int ebytes);
void gemv_w8_dense(const GemvArgs& a, void* stream);
void gemv_w8_quant(const QGemvArgs& a, void* stream);
// Whether the staged kernel needs the workspaces xh / xinv for fp8 / int8 weights with bf16 x
// of this shape (the x kernel's scaled fp16 copy; not when the weights are decoded to bf16).
bool gemv_w8_x_workspace(int64_t m, int64_t n, int64_t k);
// The ring depth of the full ring for fp8 weights [n, k] with bf16 x and this mask (or the
// knob's FR), 0 where it does not apply (tests, benchmarks).
int gemv_w8_full_depth(int64_t n, int64_t k, int mask);
// Per-CTA %globaltimer stamps of the staged 8-bit kernel (session 11, a diagnostic; src/cuda/gemv_w8.cu):
// start (clears the buffer, stamps the launches that follow), stop; read copies the stamps of every
// slot into out ([512 slots][2048 CTAs][8] uint64) and returns 6 numbers per slot: the launch's
// sequence number (-1: unused), n, k, CTAs, split, warps per CTA.
void gemv_w8_stamps_start();
void gemv_w8_stamps_stop();
std::vector<int64_t> gemv_w8_stamps_read(std::vector<uint64_t>& out);
}  // namespace cuda
// Whether the staged kernel serves fp8 / int8 weights of this shape (path 2, or the default).
bool gemv_w8_quant_enabled(int64_t n, int64_t k);
// The staged kernel's full ring for fp8 / int8 weights with bf16 x, for the GEMVs launched by
// this thread (EngineOptions::quantized_full_ring, through llm::fused::W8FullRingScope): a mask,
// bit 1 the shapes with N > K, bit 2 those with N <= K, 0 off (the default). Where the ring
// can hold each warp's whole k range with every CTA resident at once, all weight bytes are
// requested before the PDL wait. The same bits (the plan's warps and split are kept).
void gemv_w8_set_full_ring(int mask);
int gemv_w8_full_ring();
// How many gemv_quantized_prepared calls took the prepared (scaled fp16) x so far (tests:
// EngineOptions::quantized_x_prep does run; src/ops/quant.cpp).
int64_t gemv_quantized_prepared_calls();
// gk::cuda::gemv_w8_full_depth on CUDA builds (the current device), 0 elsewhere.
int gemv_w8_full_ring_depth(int64_t n, int64_t k, int mask);
// The staged 8-bit kernel's per-CTA stamps (cuda::gemv_w8_stamps_*; a ValueError without CUDA).
void gemv_w8_stamps(bool on);
std::vector<int64_t> gemv_w8_stamps_read(std::vector<uint64_t>& out);

}  // namespace gk
