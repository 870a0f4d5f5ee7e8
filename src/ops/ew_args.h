// Argument block shared by the elementwise front end and both backends: up to four
// operands (slot 0 is the output) over one broadcast shape, coalesced.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "gpukit/array.h"
#include "gpukit/ops.h"

namespace gk {

constexpr int kMaxDims = 10;
constexpr int kMaxOperands = 4;

struct EwArgs {
  int ndim = 0;
  int nops = 0;  // operands including the output
  int64_t numel = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxOperands][kMaxDims] = {};  // elements
  void* ptr[kMaxOperands] = {};
  bool contiguous = false;  // every operand dense over numel, same order
  int scalar_slot = -1;     // input slot (1 or 2) replaced by a scalar, or -1
  double scalar_f = 0;
  int64_t scalar_i = 0;
  DType in_dtype = DType::f32;
  DType out_dtype = DType::f32;
};

// Builds the block for `out` and inputs already broadcast to out's shape (a null
// entry stands for the scalar slot). Merges dimensions that are contiguous for
// every operand; throws ValueError if more than kMaxDims dimensions remain.
EwArgs make_ew_args(const Array& out, std::initializer_list<const Array*> ins);

}  // namespace gk
