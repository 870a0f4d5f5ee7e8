"""Op-table entries of the reductions, softmax/log_softmax and matmul (format:
tests/python/harness.py). Edge cases and bad input live in test_reduce.py,
test_matmul.py and test_reduce_cuda.py."""
import numpy as np

import gpukit as gk
from harness import FLOATS, HALF_FLOATS, INTS, OpSpec
from harness import float_result_dtype as _float_result, same_dtype as _same

ALL = ("size1", "size7", "size1023", "size4097", "scalar0d", "2d", "transposed", "stepped", "reversed",
       "broadcast", "empty", "empty3d")
NONEMPTY = tuple(x for x in ALL if x not in ("empty", "empty3d"))        # no identity: max/min/arg over all axes
LAST_AXIS = tuple(x for x in ALL if x not in ("scalar0d", "empty"))       # axis=-1 needs a dim; it must be nonempty
FIRST_AXIS = ("2d", "transposed", "stepped", "broadcast", "empty3d")       # axis=0 of 2-d and 3-d layouts

SUM_DTYPES = FLOATS + INTS + ("bool",)
MAX_DTYPES = FLOATS + INTS + ("bool",)


def _sum_out(dt):
    return dt if dt in FLOATS else "int64"


def _mean_out(dt):
    return dt if dt in FLOATS else "float32"


def _int64(_):
    return "int64"


def _with_specials(rng, shape, dtype, index):
    """Uniform values plus NaN and infinities (float dtypes); NaN must propagate."""
    v = rng.uniform(-3, 3, size=shape)
    if v.size >= 4:
        flat = v.reshape(-1)
        flat[rng.integers(0, flat.size, size=3)] = [np.nan, np.inf, -np.inf]
    return v


def _ties(rng, shape, dtype, index):
    """A coarse grid so that equal maxima occur: ties must go to the lowest index."""
    return rng.integers(-3, 4, size=shape).astype(np.float64) if dtype != "uint8" else rng.integers(0, 4, size=shape)


# Float sums: fp32 accumulation error relative to sum(|x|) (up to 4097 * 3) dominates near zero.
SUM_TOL = {"float64": (1e-12, 1e-9), "float32": (1e-5, 2e-3), "float16": (1e-3, 2e-3), "bfloat16": (1e-2, 2e-3),
           "float8_e4m3fn": (0.07, 1e-2), "float8_e5m2": (0.13, 1e-2)}
MEAN_TOL = {"float64": (1e-12, 1e-12), "float32": (1e-5, 1e-5), "float16": (1e-3, 1e-4), "bfloat16": (1e-2, 1e-3),
            "float8_e4m3fn": (0.07, 2.0 ** -9), "float8_e5m2": (0.13, 2.0 ** -16)}
LOGSM_TOL = {"float64": (1e-12, 1e-12), "float32": (1e-5, 1e-5), "float16": (1e-3, 1e-3), "bfloat16": (1e-2, 1e-2),
             "float8_e4m3fn": (0.07, 0.07), "float8_e5m2": (0.13, 0.13)}
MM_TOL = {"float64": (1e-12, 1e-9), "float32": (1e-5, 5e-3), "float16": (1e-3, 5e-2), "bfloat16": (1e-2, 5e-2)}


def _softmax_ref(x, axis=-1, log=False):
    if x.ndim == 0:
        return np.zeros(()) if log else np.ones(())
    if x.size == 0:
        return x.copy()
    m = x.max(axis=axis, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(axis=axis, keepdims=True)
    return (x - m) - np.log(s) if log else e / s


def _swap_last(b):
    return b if b.ndim < 2 else b.transpose(-1, -2)


def _np_swap_last(b):
    return b if b.ndim < 2 else np.swapaxes(b, -1, -2)


OPS = [
    # ---- sum / mean ----
    OpSpec("sum", lambda a: gk.sum(a), lambda a: np.sum(a), dtypes=SUM_DTYPES, out_dtype=_sum_out, layouts=ALL,
           tol=SUM_TOL),
    OpSpec("sum", lambda a: gk.sum(a, axis=-1, keepdims=True), lambda a: np.sum(a, axis=-1, keepdims=True),
           id="sum_last_keepdims", dtypes=("float32", "bfloat16", "int8", "float64"), out_dtype=_sum_out,
           layouts=LAST_AXIS, tol=SUM_TOL),
    OpSpec("sum", lambda a: a.sum(axis=0), lambda a: np.sum(a, axis=0), id="sum_first_axis",
           dtypes=("float32", "float16", "int32"), out_dtype=_sum_out, layouts=FIRST_AXIS, tol=SUM_TOL),
    OpSpec("sum", lambda a: gk.sum(a, axis=(0, -1)), lambda a: np.sum(a, axis=(0, -1)), id="sum_axes_tuple",
           dtypes=("float32",), layouts=("2d", "transposed", "stepped", "broadcast", "empty3d"), tol=SUM_TOL),
    OpSpec("mean", lambda a: gk.mean(a), lambda a: np.mean(a), dtypes=SUM_DTYPES, out_dtype=_mean_out,
           layouts=ALL, tol=MEAN_TOL),
    OpSpec("mean", lambda a: a.mean(axis=-1), lambda a: np.mean(a, axis=-1), id="mean_last_axis",
           dtypes=("float32", "bfloat16", "int32"), out_dtype=_mean_out, layouts=LAST_AXIS, tol=MEAN_TOL),
    OpSpec("mean", lambda a: gk.mean(a, axis=0, keepdims=True), lambda a: np.mean(a, axis=0, keepdims=True),
           id="mean_first_axis", dtypes=("float32", "float16"), out_dtype=_mean_out, layouts=FIRST_AXIS,
           tol=MEAN_TOL),
    # ---- max / min (exact) ----
    OpSpec("max", lambda a: gk.max(a), lambda a: np.max(a), dtypes=MAX_DTYPES, out_dtype=_same, layouts=NONEMPTY,
           exact=True, bitwise_cpu=True),
    OpSpec("max", lambda a: gk.max(a, axis=-1), lambda a: np.max(a, axis=-1), id="max_last_axis",
           dtypes=("float32", "bfloat16", "int8"), out_dtype=_same, layouts=LAST_AXIS, exact=True,
           bitwise_cpu=True),
    OpSpec("max", lambda a: gk.max(a, axis=-1), lambda a: np.max(a, axis=-1), id="max_nan", dtypes=("float32",
           "float16"), gen=_with_specials, layouts=("size7", "size1023", "size4097", "2d"), exact=True,
           bitwise_cpu=True),
    OpSpec("min", lambda a: gk.min(a), lambda a: np.min(a), dtypes=MAX_DTYPES, out_dtype=_same, layouts=NONEMPTY,
           exact=True, bitwise_cpu=True),
    OpSpec("min", lambda a: a.min(axis=0, keepdims=True), lambda a: np.min(a, axis=0, keepdims=True),
           id="min_first_axis", dtypes=("float32", "int64"), out_dtype=_same,
           layouts=("2d", "transposed", "stepped", "broadcast"), exact=True, bitwise_cpu=True),
    OpSpec("min", lambda a: gk.min(a, axis=-1), lambda a: np.min(a, axis=-1), id="min_nan",
           dtypes=("float32", "bfloat16"), gen=_with_specials, layouts=("size7", "size1023", "2d"), exact=True,
           bitwise_cpu=True),
    # ---- argmax / argmin (exact; ties to the lowest index; the first NaN wins) ----
    OpSpec("argmax", lambda a: gk.argmax(a), lambda a: np.argmax(a), dtypes=MAX_DTYPES, out_dtype=_int64,
           layouts=NONEMPTY, exact=True, bitwise_cpu=True),
    OpSpec("argmax", lambda a: gk.argmax(a, axis=-1, keepdims=True),
           lambda a: np.argmax(a, axis=-1, keepdims=True), id="argmax_ties", dtypes=("float32", "bfloat16",
           "int32", "uint8"), gen=_ties, out_dtype=_int64, layouts=LAST_AXIS, exact=True, bitwise_cpu=True),
    OpSpec("argmax", lambda a: a.argmax(axis=0), lambda a: np.argmax(a, axis=0), id="argmax_first_axis",
           dtypes=("float32",), gen=_ties, layouts=("2d", "transposed", "stepped", "broadcast"), exact=True,
           bitwise_cpu=True),
    OpSpec("argmax", lambda a: gk.argmax(a, axis=-1), lambda a: np.argmax(a, axis=-1), id="argmax_nan",
           dtypes=("float32", "float16"), gen=_with_specials, layouts=("size7", "size1023", "size4097", "2d"),
           exact=True, bitwise_cpu=True),
    OpSpec("argmin", lambda a: gk.argmin(a), lambda a: np.argmin(a), dtypes=MAX_DTYPES, out_dtype=_int64,
           layouts=NONEMPTY, exact=True, bitwise_cpu=True),
    OpSpec("argmin", lambda a: a.argmin(axis=-1), lambda a: np.argmin(a, axis=-1), id="argmin_ties",
           dtypes=("float32", "int8"), gen=_ties, out_dtype=_int64, layouts=LAST_AXIS, exact=True,
           bitwise_cpu=True),
    OpSpec("argmin", lambda a: gk.argmin(a, axis=-1), lambda a: np.argmin(a, axis=-1), id="argmin_nan",
           dtypes=("float32",), gen=_with_specials, layouts=("size7", "size1023", "2d"), exact=True,
           bitwise_cpu=True),
    # ---- softmax / log_softmax ----
    OpSpec("softmax", lambda a: gk.softmax(a), lambda a: _softmax_ref(a), dtypes=FLOATS + ("int32",),
           out_dtype=_float_result, layouts=ALL, low=-8, high=8),
    OpSpec("softmax", lambda a: gk.softmax(a, axis=0), lambda a: _softmax_ref(a, axis=0), id="softmax_first_axis",
           dtypes=("float32", "bfloat16"), layouts=FIRST_AXIS, low=-8, high=8),
    OpSpec("log_softmax", lambda a: gk.log_softmax(a), lambda a: _softmax_ref(a, log=True),
           dtypes=FLOATS + ("int8",), out_dtype=_float_result, layouts=ALL, low=-8, high=8, tol=LOGSM_TOL),
    OpSpec("log_softmax", lambda a: gk.log_softmax(a, axis=0), lambda a: _softmax_ref(a, axis=0, log=True),
           id="log_softmax_first_axis", dtypes=("float32", "float16"), layouts=FIRST_AXIS, low=-8, high=8,
           tol=LOGSM_TOL),
    # ---- matmul: a @ swap_last(b) (1-d: dot product; broadcast: batch dims) ----
    OpSpec("matmul", lambda a, b: gk.matmul(a, _swap_last(b)), lambda a, b: np.matmul(a, _np_swap_last(b)), nin=2,
           dtypes=HALF_FLOATS, out_dtype=_same, layouts=tuple(x for x in ALL if x != "scalar0d"), tol=MM_TOL,
           low=-1, high=1),
    OpSpec("matmul", lambda a, b: a @ _swap_last(b), lambda a, b: np.matmul(a, _np_swap_last(b)), nin=2,
           id="matmul_operator_mixed", dtypes=("float32",), in_dtypes=lambda dt: ("bfloat16", "float16"),
           out_dtype=lambda dt: "float32", layouts=("size7", "2d", "transposed", "broadcast"), tol=MM_TOL,
           low=-1, high=1),
]
