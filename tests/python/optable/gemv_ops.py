"""Op-table entries of the quantized GEMV formats added after gemm_ops.py's (format:
tests/python/harness.py): nvf4 and the GGUF blocks q8_0, q4_0, q4_1, q4_k, q6_k. w is quantized inside
the call; the reference multiplies by the exact dequantized weight (the rules are checked in
test_quant_nvf4.py and test_quant_gguf.py)."""
import numpy as np

import gpukit as gk
from harness import OpSpec

QTOL = {"bfloat16": (1e-5, 1e-4), "float16": (1e-5, 1e-4), "float32": (1e-5, 1e-4)}


def _nvf4_call(x, w):
    q, bs, ts = gk.quantize_nvf4(w.astype("float32"))
    return gk.gemv_nvf4(x, q, bs, ts, out_dtype="float32")


def _nvf4_ref(x, w):
    q, bs, ts = gk.quantize_nvf4(gk.asarray(np.ascontiguousarray(w, dtype=np.float32)))
    return x @ gk.dequantize_nvf4(q, bs, ts).numpy().astype(np.float64).T


def _gguf_call(fmt, x, w):
    return getattr(gk, f"gemv_{fmt}")(x, getattr(gk, f"quantize_{fmt}")(w.astype("float32")), out_dtype="float32")


def _gguf_ref(fmt, x, w):
    q = getattr(gk, f"quantize_{fmt}")(gk.asarray(np.ascontiguousarray(w, dtype=np.float32)))
    return x @ getattr(gk, f"dequantize_{fmt}")(q).numpy().astype(np.float64).T


def _plan32(layout):
    return {
        "small": [((3, 64), None), ((9, 64), None)],
        "one_row": [((1, 256), None), ((5, 256), None)],
        "eight": [((8, 512), None), ((31, 512), None)],
        "offset_x": [((4, 96), "offset1"), ((7, 96), None)],
    }.get(layout)


def _plan256(layout):
    return {
        "small": [((3, 256), None), ((9, 256), None)],
        "one_row": [((1, 512), None), ((5, 512), None)],
        "eight": [((8, 768), None), ((31, 768), None)],
        "offset_x": [((4, 256), "offset1"), ((7, 256), None)],
    }.get(layout)


_COMMON = dict(nin=2, layouts=("small", "one_row", "eight", "offset_x"), dtypes=("bfloat16", "float16"),
               in_dtypes=lambda dt: (dt, "float32"), out_dtype=lambda dt: "float32", tol=QTOL, low=-1, high=1)

OPS = [OpSpec("gemv_nvf4", _nvf4_call, _nvf4_ref, plan=_plan32, **_COMMON)]
for _fmt, _plan in (("q8_0", _plan32), ("q4_0", _plan32), ("q4_1", _plan32), ("q4_k", _plan256), ("q6_k", _plan256)):
    OPS.append(OpSpec(f"gemv_{_fmt}", (lambda f: lambda x, w: _gguf_call(f, x, w))(_fmt),
                      (lambda f: lambda x, w: _gguf_ref(f, x, w))(_fmt), plan=_plan, **_COMMON))
