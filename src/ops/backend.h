// Kernel entry points of the two backends. They take plain argument blocks and
// know nothing of Arrays or Python. The CUDA ones exist only when built with CUDA.
#pragma once
#include "gpukit/errors.h"
#include "ops/ew_args.h"
#include "ops/registry.h"

namespace gk {

// Row-wise problems: `rows` rows of `cols` elements, row r starting at r*row_stride
// (elements within a row are contiguous). Reductions write one element per row
// (out + r*out_row_stride); softmax writes a row per row. `work` is device scratch
// of cuda::reduce_rows_workspace(op, args) bytes (null when that is 0).
struct RowArgs {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t in_row_stride = 0, out_row_stride = 0;
  DType in_dtype = DType::f32, out_dtype = DType::f32;
  void* work = nullptr;
};

// Batched matrix product: C[b] = A[b] @ B[b] with arbitrary element strides.
struct MatmulArgs {
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int64_t batch = 1, m = 0, n = 0, k = 0;
  // batch offsets: per batch index, computed from up to kMaxDims batch dims
  int batch_ndim = 0;
  int64_t batch_shape[kMaxDims] = {};
  int64_t a_batch_strides[kMaxDims] = {}, b_batch_strides[kMaxDims] = {};
  int64_t a_rs = 0, a_cs = 0, b_rs = 0, b_cs = 0, c_rs = 0;  // row/col strides
  int64_t c_cs = 1;
  DType dtype = DType::f32;      // of a and b
  DType out_dtype = DType::f32;  // of c (the result is rounded once from the fp32/fp64 accumulator)
  bool allow_tf32 = false;       // float32 only; the CPU and gpukit's CUDA kernel compute true fp32 anyway
};

// Epilogue of linear / gate_up_swiglu over an accumulator `acc` [m, n_acc] (f32,
// or f64 for float64), contiguous. linear: out[i,j] = act(acc[i,j] + bias[j]) + res[i,j]
// (bias/res optional, both of out_dtype, res contiguous [m, n]); swiglu (act ignored):
// out[i,j] = silu(acc[i,j]) * acc[i,n+j] with n_acc = 2n. Rounded once to out_dtype.
struct EpilogueArgs {
  const void* acc = nullptr;
  const void* bias = nullptr;
  const void* res = nullptr;
  void* out = nullptr;
  int64_t m = 0, n = 0;
  DType acc_dtype = DType::f32, out_dtype = DType::f32;
  int act = 0;  // 0 none, 1 gelu (erf), 2 gelu_tanh, 3 silu
  bool swiglu = false;
};

// W8A8 / FP8 epilogue: out[i,j] = float(acc[i,j]) * xs[i] * ws[j] (+ bias[j]), rounded
// once to out_dtype (f32/f16/bf16); acc [m, n] contiguous, int32 or float32 (acc_dtype);
// bias of out_dtype or null.
struct Int8EpilogueArgs {
  const void* acc = nullptr;
  DType acc_dtype = DType::i32;
  const float* xs = nullptr;
  const float* ws = nullptr;
  const void* bias = nullptr;
  void* out = nullptr;
  int64_t m = 0, n = 0;
  DType out_dtype = DType::f32;
};

namespace cpu {
void copy(const EwArgs& a);  // in_dtype -> out_dtype, slot 1 -> slot 0
void fill(const EwArgs& a);  // scalar -> slot 0
void arange(const EwArgs& a, double start, double step);
void binary(BinaryOp op, const EwArgs& a);
void unary(UnaryOp op, const EwArgs& a);
void where(const EwArgs& a);  // slot1 cond (bool), slots 2,3 values
void clamp(const EwArgs& a, bool has_lo, double lo, bool has_hi, double hi);
void reduce_rows(ReduceOp op, const RowArgs& a);  // one result per row
void softmax_rows(const RowArgs& a, bool log);
void matmul(const MatmulArgs& a);
void gemm_epilogue(const EpilogueArgs& a);
void matmul_i8(const MatmulArgs& a);  // int8 x int8 -> int32, exact; batch 1
void int8_epilogue(const Int8EpilogueArgs& a);
}  // namespace cpu

namespace cuda {
void copy(const EwArgs& a, void* stream);
void fill(const EwArgs& a, void* stream);
void arange(const EwArgs& a, double start, double step, void* stream);
void binary(BinaryOp op, const EwArgs& a, void* stream);
void unary(UnaryOp op, const EwArgs& a, void* stream);
void where(const EwArgs& a, void* stream);
void clamp(const EwArgs& a, bool has_lo, double lo, bool has_hi, double hi, void* stream);
void reduce_rows(ReduceOp op, const RowArgs& a, void* stream);
// Scratch bytes reduce_rows needs (for long rows split in two deterministic passes).
size_t reduce_rows_workspace(ReduceOp op, const RowArgs& a);
void softmax_rows(const RowArgs& a, bool log, void* stream);
void matmul(const MatmulArgs& a, void* stream);
void gemm_epilogue(const EpilogueArgs& a, void* stream);
void matmul_i8(const MatmulArgs& a, void* stream);
void int8_epilogue(const Int8EpilogueArgs& a, void* stream);
// Host<->device and device<->device byte copies of contiguous memory.
void memcpy_async(void* dst, const void* src, size_t bytes, int kind, void* stream);
}  // namespace cuda

}  // namespace gk
