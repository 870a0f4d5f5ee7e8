"""Op-table entries of linear and gate_up_swiglu (format: tests/python/harness.py). Edge
cases, options and bad input are in test_gemm.py; the CUDA paths in test_gemm_cuda.py."""
import math

import numpy as np

import gpukit as gk
from harness import OpSpec

TOL = {"float64": (1e-12, 1e-9), "float32": (1e-5, 5e-4), "float16": (2e-3, 5e-3), "bfloat16": (1e-2, 2e-2)}
ERF = np.vectorize(math.erf, otypes=[np.float64])


def _silu(v):
    return v / (1 + np.exp(-v))


def _gelu(v):
    return 0.5 * v * (1 + ERF(v / math.sqrt(2)))


def _lin_plan(layout):
    return {
        "small": [((7, 5), None), ((3, 5), None), ((3,), None), ((7, 3), None)],
        "batched": [((2, 3, 17), None), ((9, 17), None), ((9,), None), ((2, 3, 9), None)],
        "transposed": [((17, 6), "T"), ((17, 9), "T"), ((9,), "rev"), ((9, 6), "T")],
        "offset": [((8, 33), "offset1"), ((12, 33), "step2"), ((7,), "offset1"), ((8, 6), "offset1")],
        "empty": [((0, 5), None), ((4, 5), None), ((4,), None), ((0, 4), None)],
    }.get(layout)


def _glu_plan(layout):
    return {
        "small": [((7, 5), None), ((6, 5), None)],
        "batched": [((2, 3, 17), None), ((18, 17), None)],
        "transposed": [((17, 6), "T"), ((17, 10), "T")],
        "offset": [((8, 33), "offset1"), ((12, 33), "step2")],
    }.get(layout)


def _glu_ref(x, w):
    i = w.shape[0] // 2
    return _silu(x @ w[:i].T) * (x @ w[i:].T)


LAYOUTS = ("small", "batched", "transposed", "offset", "empty")

OPS = [
    OpSpec("linear", lambda x, w, b, r: gk.linear(x, w, bias=b, activation="silu", residual=r),
           lambda x, w, b, r: _silu(x @ w.T + b) + r, nin=4, plan=_lin_plan, layouts=LAYOUTS,
           dtypes=("float32", "bfloat16", "float16", "float64"), tol=TOL, low=-1, high=1),
    OpSpec("linear", lambda x, w, b, r: gk.linear(x, w, bias=b, activation="gelu"),
           lambda x, w, b, r: _gelu(x @ w.T + b), nin=4, plan=_lin_plan, layouts=LAYOUTS, id="linear_gelu_bias",
           dtypes=("float32", "bfloat16"), tol=TOL, low=-1, high=1),
    OpSpec("linear", lambda x, w, b, r: gk.linear(x, w, bias=b, residual=r),
           lambda x, w, b, r: x @ w.T + b + r, nin=4, plan=_lin_plan, layouts=LAYOUTS, id="linear_bias_residual",
           dtypes=("bfloat16", "float32"), tol=TOL, low=-1, high=1),
    OpSpec("gate_up_swiglu", lambda x, w: gk.gate_up_swiglu(x, w), _glu_ref, nin=2, plan=_glu_plan,
           layouts=LAYOUTS[:4], dtypes=("float32", "bfloat16", "float16"), tol=TOL, low=-1, high=1),
]


def _gemv_plan(layout):
    return {
        "small": [((3, 40), None), ((9, 40), None)],
        "one_row": [((1, 257), None), ((5, 257), None)],
        "offset": [((5, 33), "offset1"), ((8, 33), "offset1")],
        "strided_w": [((2, 16), None), ((14, 16), "step2")],
        "eight": [((8, 1024), None), ((31, 1024), None)],
    }.get(layout)


OPS.append(OpSpec("gemv", lambda x, w: gk.gemv(x, w), lambda x, w: x @ w.T, nin=2, plan=_gemv_plan,
                  layouts=("small", "one_row", "offset", "strided_w", "eight"), dtypes=("bfloat16", "float16"),
                  tol=TOL, low=-1, high=1))


# ---- quantized GEMV: w is quantized inside the call; the reference multiplies by the exact
# dequantized weight (the quantize/dequantize rules are checked against NumPy in test_quant.py) ----

def _deq(fmt, w, g=64):
    wa = gk.asarray(np.ascontiguousarray(w, dtype=np.float32))
    if fmt == "int4":
        q, s, z = gk.quantize_int4(wa, group=g)
        return gk.dequantize_int4(q, s, z, group=g).numpy().astype(np.float64)
    q, s = getattr(gk, f"quantize_{fmt}")(wa)
    return getattr(gk, f"dequantize_{fmt}")(q, s).numpy().astype(np.float64)


def _qcall(fmt, x, w, g=64):
    w32 = w.astype("float32")
    if fmt == "int4":
        q, s, z = gk.quantize_int4(w32, group=g)
        return gk.gemv_int4(x, q, s, z, group=g, out_dtype="float32")
    q, s = getattr(gk, f"quantize_{fmt}")(w32)
    return getattr(gk, f"gemv_{fmt}")(x, q, s, out_dtype="float32")


def _qplan(layout):
    return {
        "small": [((3, 128), None), ((9, 128), None)],
        "one_row": [((1, 256), None), ((5, 256), None)],
        "eight": [((8, 512), None), ((31, 512), None)],
        "offset_x": [((4, 128), "offset1"), ((7, 128), None)],
    }.get(layout)


QTOL = {"bfloat16": (1e-5, 1e-4), "float16": (1e-5, 1e-4), "float32": (1e-5, 1e-4)}
for _fmt in ("fp8", "int8", "int4"):
    OPS.append(OpSpec(f"gemv_{_fmt}", (lambda f: lambda x, w: _qcall(f, x, w))(_fmt),
                      (lambda f: lambda x, w: x @ _deq(f, w).T)(_fmt), nin=2, plan=_qplan,
                      layouts=("small", "one_row", "eight", "offset_x"), dtypes=("bfloat16", "float16"),
                      in_dtypes=lambda dt: (dt, "float32"), out_dtype=lambda dt: "float32", tol=QTOL,
                      low=-1, high=1))


def _i8_plan(layout):
    return {
        "small": [((7, 16), None), ((5, 16), None)],
        "batched": [((2, 3, 33), None), ((9, 33), None)],
        "offset": [((8, 64), "offset1"), ((12, 64), "step2")],
        "wide": [((3, 1000), None), ((70, 1000), None)],
    }.get(layout)


OPS.append(OpSpec("int8_linear", lambda x, w: gk.int8_linear(x, w), lambda x, w: x @ w.T, nin=2, plan=_i8_plan,
                  layouts=("small", "batched", "offset", "wide"), dtypes=("int8",), exact=True,
                  out_dtype=lambda dt: "int32", gen=lambda rng, shape, dt, i: rng.integers(-128, 128, size=shape)))


def _fp8_plan(layout):
    return {
        "small": [((7, 16), None), ((5, 16), None)],
        "batched": [((2, 3, 32), None), ((9, 32), None)],
        "offset": [((8, 64), "offset1"), ((12, 64), "step2")],
    }.get(layout)


OPS.append(OpSpec("fp8_linear", lambda x, w: gk.fp8_linear(x, w, gk.ones(1, device=x.device.type),
                                                             gk.full((1,), 0.5, device=x.device.type),
                                                             out_dtype="float32"),
                  lambda x, w: (x @ w.T) * 0.5, nin=2, plan=_fp8_plan, layouts=("small", "batched", "offset"),
                  dtypes=("float8_e4m3fn",), out_dtype=lambda dt: "float32",
                  tol={"float32": (1e-5, 1e-4)}, low=-2, high=2))
