"""Matrix products: matmul options, Linear with fused epilogues, gate-up SwiGLU,
the float32 matmul precision, and where cuBLASLt was found.

    y = gk.linear(x, w, bias=b, activation="silu", residual=r)
    h = gk.gate_up_swiglu(x, w_gate_up)         # silu(x @ Wg.T) * (x @ Wu.T)
    with gk.matmul_precision("tf32"):           # float32 products may use TF32
        c = gk.matmul(a, b)

cuBLASLt is loaded at run time (never linked). Besides the CUDA toolkit, the
PyPI wheel ``nvidia-cublas`` is searched (site-packages/nvidia/cu13/lib,
nvidia/cublas/lib); GPUKIT_CUBLASLT_PATH names the library or its folder, and
GPUKIT_DISABLE_CUBLASLT=1 makes gpukit use its own kernels.
"""
from __future__ import annotations

import contextlib
import os

from . import _C

matmul = _C.matmul
linear = _C.linear
gate_up_swiglu = _C.gate_up_swiglu
gemv = _C.gemv
# Quantized weights for the decode GEMV: quantize_<f>, dequantize_<f> (exact float32
# values) and gemv_<f> for f in QUANT_FORMATS (include/gpukit/quant.h).
QUANT_FORMATS = ("fp8", "int8", "int4", "nvf4", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k")
quantize_fp8, quantize_int8, quantize_int4, quantize_nvf4 = (
    _C.quantize_fp8, _C.quantize_int8, _C.quantize_int4, _C.quantize_nvf4)
dequantize_fp8, dequantize_int8, dequantize_int4, dequantize_nvf4 = (
    _C.dequantize_fp8, _C.dequantize_int8, _C.dequantize_int4, _C.dequantize_nvf4)
gemv_fp8, gemv_int8, gemv_int4, gemv_nvf4 = _C.gemv_fp8, _C.gemv_int8, _C.gemv_int4, _C.gemv_nvf4
quantize_q8_0, quantize_q4_0, quantize_q4_1, quantize_q4_k, quantize_q6_k = (
    _C.quantize_q8_0, _C.quantize_q4_0, _C.quantize_q4_1, _C.quantize_q4_k, _C.quantize_q6_k)
dequantize_q8_0, dequantize_q4_0, dequantize_q4_1, dequantize_q4_k, dequantize_q6_k = (
    _C.dequantize_q8_0, _C.dequantize_q4_0, _C.dequantize_q4_1, _C.dequantize_q4_k, _C.dequantize_q6_k)
gemv_q8_0, gemv_q4_0, gemv_q4_1, gemv_q4_k, gemv_q6_k = (
    _C.gemv_q8_0, _C.gemv_q4_0, _C.gemv_q4_1, _C.gemv_q4_k, _C.gemv_q6_k)
int8_linear = _C.int8_linear
fp8_linear = _C.fp8_linear
fp8_block_linear = _C.fp8_block_linear
quantize_fp8_blocks = _C.quantize_fp8_blocks
moe_topk_gating, moe_permute, moe_unpermute = _C.moe_topk_gating, _C.moe_permute, _C.moe_unpermute
moe_grouped_gemm, moe_mlp = _C.moe_grouped_gemm, _C.moe_mlp
set_matmul_precision = _C.set_matmul_precision
get_matmul_precision = _C.get_matmul_precision


@contextlib.contextmanager
def matmul_precision(precision: str):
    """Sets the float32 matmul precision ('highest' or 'tf32') inside the block."""
    old = get_matmul_precision()
    set_matmul_precision(precision)
    try:
        yield
    finally:
        set_matmul_precision(old)


def _wheel_lib_dirs() -> list[str]:
    dirs = []
    try:
        import nvidia  # namespace package of the NVIDIA wheels
    except ImportError:
        return dirs
    for root in list(getattr(nvidia, "__path__", [])):
        for sub in ("cu13/lib", "cublas/lib"):
            d = os.path.join(root, sub)
            if os.path.isdir(d):
                dirs.append(d)
    return dirs


_C._cublaslt_add_search_paths(_wheel_lib_dirs())


def cublaslt_info() -> dict:
    """{'available', 'path', 'reason', 'version', 'lt_calls', 'fallback_calls', 'plans', 'no_algo'}.
    Loads cuBLASLt on the first call (CUDA builds)."""
    return dict(_C._cublaslt_info())


def cublaslt_available() -> bool:
    return bool(_C._cublaslt_info()["available"])
