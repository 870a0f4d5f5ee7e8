"""gpukit: a small, explicit, deterministic GPU runtime for LLM inference.

    import gpukit as gk
    a = gk.arange(6, dtype=gk.float32).reshape(2, 3)
    b = a.to("cuda") * 2          # runs on the GPU when one is present
"""
from __future__ import annotations

from . import _C
from ._C import (  # noqa: F401
    Array, Device, DType, Event, Graph, Stream, CudaError, OutOfMemoryError,
    add, sub, mul, div, pow, maximum, minimum, eq, ne, lt, le, gt, ge, logical_and, logical_or,
    neg, abs, exp, log, sqrt, rsqrt, sin, cos, tanh, sigmoid, relu, silu, gelu, gelu_tanh, logical_not,
    clamp, where, copy_into, devices, synchronize, device_properties, memory_stats,
    reset_peak_memory_stats, set_memory_limit, empty_cache, promote_types, registered_ops,
)
from ._array import (  # noqa: F401
    asarray, array, from_numpy, empty, zeros, ones, full, arange, empty_like, zeros_like, ones_like, full_like,
    to_numpy,
)
from . import _stream  # noqa: F401  (adds `with stream:` and Graph context managers)
from . import cuda  # noqa: F401
from .interop import from_dlpack, from_cuda_array_interface  # noqa: F401
from . import nn  # noqa: F401
from . import sampling  # noqa: F401
from .jit import JitError, JitKernel  # noqa: F401  (gk.jit: the callable module; gk.jit.is_available())

bool_ = DType.bool
uint8 = DType.uint8
int8 = DType.int8
int16 = DType.int16
int32 = DType.int32
int64 = DType.int64
float8_e4m3fn = DType.float8_e4m3fn
float8_e5m2 = DType.float8_e5m2
float16 = DType.float16
half = DType.float16
bfloat16 = DType.bfloat16
float32 = DType.float32
float64 = DType.float64

_optional = []
for _name in ("sum", "mean", "max", "min", "argmax", "argmin", "softmax", "log_softmax", "matmul", "embedding"):
    if hasattr(_C, _name):
        globals()[_name] = getattr(_C, _name)

from .linalg import (  # noqa: F401,E402
    linear, gate_up_swiglu, gemv, set_matmul_precision, get_matmul_precision, matmul_precision,
    quantize_fp8, quantize_int8, quantize_int4, dequantize_fp8, dequantize_int8, dequantize_int4,
    gemv_fp8, gemv_int8, gemv_int4, quantize_q8_0, quantize_q4_0, dequantize_q8_0, dequantize_q4_0,
    gemv_q8_0, gemv_q4_0, int8_linear, fp8_linear,
    quantize_nvf4, dequantize_nvf4, gemv_nvf4, quantize_q4_1, dequantize_q4_1, gemv_q4_1,
    quantize_q4_k, dequantize_q4_k, gemv_q4_k, quantize_q6_k, dequantize_q6_k, gemv_q6_k,
    fp8_block_linear, quantize_fp8_blocks,
    moe_topk_gating, moe_permute, moe_unpermute, moe_grouped_gemm, moe_mlp,
)

try:
    from . import io  # noqa: F401
except ImportError:  # pragma: no cover - built without the readers
    pass
try:
    from . import text  # noqa: F401
except ImportError:  # pragma: no cover - built without the tokenizers
    pass

try:
    from . import llm  # noqa: F401
except ImportError:  # pragma: no cover - built without the LLM engine
    pass

__version__ = "0.1.0"
