// Reductions with an explicit "all axes" flag, for the bindings: `axes` null
// reduces every axis; an empty list reduces none (NumPy's axis=()).
#pragma once
#include <vector>

#include "gpukit/ops.h"

namespace gk::detail {
Array reduce_over(ReduceOp op, const Array& a, const std::vector<int>* axes, bool keepdims, const Stream* s);
}  // namespace gk::detail
