"""Op-table entries of the elementwise ops (format: tests/python/harness.py)."""
import math

import numpy as np

import gpukit as gk
from harness import FLOATS, HALF_FLOATS, INTS, SIGNED_INTS, OpSpec
from harness import float_result_dtype as _float_result, same_dtype as _same

_erf_u = np.frompyfunc(math.erf, 1, 1)


def _erf(x):
    return np.asarray(_erf_u(x), dtype=np.float64)


def _bool(_):
    return "bool"


def _grid(rng, shape, dtype, index):
    """Values on a coarse grid (exact in every dtype) so that ties and equalities occur."""
    if dtype == "uint8":
        return rng.integers(0, 6, size=shape)
    return rng.integers(-6, 7, size=shape) * 0.5 if dtype in FLOATS else rng.integers(-3, 4, size=shape)


def _nonzero(rng, shape, dtype, index):
    """Denominators away from zero."""
    if index == 0:
        return rng.uniform(-3, 3, size=shape) if dtype in FLOATS else rng.integers(-10, 11, size=shape)
    mag = rng.uniform(0.5, 2.0, size=shape) if dtype in FLOATS else rng.integers(1, 5, size=shape)
    return np.where(rng.random(shape) < 0.5, -mag, mag)


def _pow_inputs(rng, shape, dtype, index):
    if dtype in FLOATS:
        return rng.uniform(0.25, 2.0, size=shape) if index == 0 else rng.uniform(-2.0, 2.0, size=shape)
    return rng.integers(-3, 4, size=shape) if index == 0 else rng.integers(0, 4, size=shape)


def _logical(rng, shape, dtype, index):
    return rng.choice([0.0, 1.0, -2.0, 0.5], size=shape) if dtype != "bool" else (rng.random(shape) < 0.5)


def _with_specials(rng, shape, dtype, index):
    """Uniform values plus NaN and infinities (float dtypes)."""
    v = rng.uniform(-3, 3, size=shape)
    if v.size >= 4:
        flat = v.reshape(-1)
        flat[rng.integers(0, flat.size, size=3)] = [np.nan, np.inf, -np.inf]
    return v


def _ipow(a, b):
    return np.power(a.astype(np.int64), b.astype(np.int64)).astype(np.float64)


ARITH_DTYPES = HALF_FLOATS + ("float8_e4m3fn", "float8_e5m2", "int32", "int8", "uint8", "int64")

OPS = [
    # ---- binary arithmetic ----
    OpSpec("add", lambda a, b: gk.add(a, b), lambda a, b: a + b, nin=2, dtypes=ARITH_DTYPES,
           out_dtype=_same, bitwise_cpu=True),
    OpSpec("add", lambda a, b: a + b, lambda a, b: a + b, nin=2, id="add_operator", dtypes=("float32",),
           layouts=("size7", "broadcast"), bitwise_cpu=True),
    OpSpec("add", lambda a: a + 0.5, lambda a: a + 0.5, id="add_scalar", dtypes=("float32", "bfloat16", "float16"),
           out_dtype=_same, bitwise_cpu=True),
    OpSpec("add", lambda a, b: gk.add(a, b), lambda a, b: a + b, nin=2, id="add_mixed_dtypes",
           dtypes=("float32",), in_dtypes=lambda dt: ("int32", "bfloat16"), out_dtype=lambda dt: "bfloat16",
           layouts=("size7", "size4097", "broadcast"), low=-50, high=50, bitwise_cpu=True),
    OpSpec("sub", lambda a, b: gk.sub(a, b), lambda a, b: a - b, nin=2,
           dtypes=HALF_FLOATS + ("float8_e5m2", "int32", "int8", "int64"), out_dtype=_same, bitwise_cpu=True),
    OpSpec("sub", lambda a: 2.0 - a, lambda a: 2.0 - a, id="rsub_scalar", dtypes=("float32", "float16"),
           out_dtype=_same, bitwise_cpu=True),
    OpSpec("mul", lambda a, b: gk.mul(a, b), lambda a, b: a * b, nin=2, dtypes=ARITH_DTYPES, out_dtype=_same,
           bitwise_cpu=True),
    OpSpec("div", lambda a, b: gk.div(a, b), lambda a, b: a / b, nin=2,
           dtypes=HALF_FLOATS + ("float8_e4m3fn", "int32", "int64"), out_dtype=_float_result, gen=_nonzero,
           bitwise_cpu=True),
    OpSpec("div", lambda a: 3.0 / a, lambda a: 3.0 / a, id="rdiv_scalar", dtypes=("float32", "bfloat16"),
           gen=_nonzero, bitwise_cpu=True),
    OpSpec("pow", lambda a, b: gk.pow(a, b), lambda a, b: np.power(a, b), nin=2, dtypes=HALF_FLOATS,
           out_dtype=_same, gen=_pow_inputs),
    OpSpec("pow", lambda a, b: gk.pow(a, b), _ipow, nin=2, id="pow_int", dtypes=("int32", "int64", "int8"),
           out_dtype=_same, gen=_pow_inputs, exact=True),
    OpSpec("pow", lambda a: a ** 2.0, lambda a: a ** 2.0, id="pow_scalar", dtypes=("float32",), bitwise_cpu=False),
    OpSpec("maximum", lambda a, b: gk.maximum(a, b), lambda a, b: np.maximum(a, b), nin=2,
           dtypes=ARITH_DTYPES, out_dtype=_same, gen=_grid, bitwise_cpu=True),
    # NaN payloads differ between x86 and CUDA arithmetic, so these compare values, not bits
    OpSpec("maximum", lambda a, b: gk.maximum(a, b), lambda a, b: np.maximum(a, b), nin=2, id="maximum_nan",
           dtypes=("float32", "float16"), gen=_with_specials, layouts=("size7", "size1023"), bitwise_cpu=False),
    OpSpec("minimum", lambda a, b: gk.minimum(a, b), lambda a, b: np.minimum(a, b), nin=2,
           dtypes=ARITH_DTYPES, out_dtype=_same, gen=_grid, bitwise_cpu=True),
    OpSpec("minimum", lambda a, b: gk.minimum(a, b), lambda a, b: np.minimum(a, b), nin=2, id="minimum_nan",
           dtypes=("float32", "bfloat16"), gen=_with_specials, layouts=("size7", "size1023"), bitwise_cpu=False),
    # ---- comparisons and logical ----
    *[OpSpec(n, f, r, nin=2, dtypes=("float32", "bfloat16", "float8_e4m3fn", "int32", "uint8", "float64"),
             out_dtype=_bool, gen=_grid, exact=True)
      for n, f, r in [
          ("eq", lambda a, b: gk.eq(a, b), lambda a, b: a == b),
          ("ne", lambda a, b: gk.ne(a, b), lambda a, b: a != b),
          ("lt", lambda a, b: gk.lt(a, b), lambda a, b: a < b),
          ("le", lambda a, b: gk.le(a, b), lambda a, b: a <= b),
          ("gt", lambda a, b: gk.gt(a, b), lambda a, b: a > b),
          ("ge", lambda a, b: gk.ge(a, b), lambda a, b: a >= b),
      ]],
    OpSpec("lt", lambda a: a < 0.5, lambda a: a < 0.5, id="lt_scalar", dtypes=("float32", "int32"), out_dtype=_bool,
           gen=_grid, exact=True),
    OpSpec("logical_and", lambda a, b: gk.logical_and(a, b), lambda a, b: (a != 0) & (b != 0), nin=2,
           dtypes=("bool", "float32", "int32"), out_dtype=_bool, gen=_logical, exact=True),
    OpSpec("logical_or", lambda a, b: gk.logical_or(a, b), lambda a, b: (a != 0) | (b != 0), nin=2,
           dtypes=("bool", "float32", "int8"), out_dtype=_bool, gen=_logical, exact=True),
    OpSpec("logical_not", lambda a: gk.logical_not(a), lambda a: a == 0,
           dtypes=("bool", "float32", "int32", "bfloat16"), out_dtype=_bool, gen=_logical, exact=True),
    # ---- unary ----
    OpSpec("neg", lambda a: gk.neg(a), lambda a: -a, dtypes=FLOATS + SIGNED_INTS, out_dtype=_same, exact=True),
    OpSpec("neg", lambda a: -a, lambda a: -a, id="neg_operator", dtypes=("float32",), layouts=("size7", "stepped"),
           exact=True),
    OpSpec("abs", lambda a: gk.abs(a), np.abs, dtypes=FLOATS + INTS, out_dtype=_same, exact=True),
    OpSpec("relu", lambda a: gk.relu(a), lambda a: np.maximum(a, 0), dtypes=FLOATS + SIGNED_INTS,
           out_dtype=_same, exact=True),
    # NaN payloads are not preserved on CUDA (the select compiles to a NaN-propagating max that
    # returns the canonical NaN), so NaN inputs compare by value
    OpSpec("relu", lambda a: gk.relu(a), lambda a: np.where(np.isnan(a), a, np.maximum(a, 0)), id="relu_nan",
           dtypes=("float32",), gen=_with_specials, layouts=("size1023",), exact=False),
    OpSpec("exp", lambda a: gk.exp(a), np.exp, dtypes=FLOATS, out_dtype=_same),
    OpSpec("exp", lambda a: gk.exp(a), np.exp, id="exp_int", dtypes=("int32", "int8"), out_dtype=_float_result,
           layouts=("size7", "transposed")),
    OpSpec("log", lambda a: gk.log(a), np.log, dtypes=FLOATS, out_dtype=_same, low=0.05, high=5.0),
    OpSpec("sqrt", lambda a: gk.sqrt(a), np.sqrt, dtypes=FLOATS, out_dtype=_same, low=0.0, high=9.0,
           bitwise_cpu=True),
    OpSpec("rsqrt", lambda a: gk.rsqrt(a), lambda a: 1.0 / np.sqrt(a), dtypes=FLOATS, out_dtype=_same, low=0.05,
           high=9.0),
    OpSpec("sin", lambda a: gk.sin(a), np.sin, dtypes=FLOATS, out_dtype=_same, low=-4.0, high=4.0),
    OpSpec("cos", lambda a: gk.cos(a), np.cos, dtypes=FLOATS, out_dtype=_same, low=-4.0, high=4.0),
    OpSpec("tanh", lambda a: gk.tanh(a), np.tanh, dtypes=FLOATS, out_dtype=_same),
    OpSpec("sigmoid", lambda a: gk.sigmoid(a), lambda a: 1.0 / (1.0 + np.exp(-a)), dtypes=FLOATS, out_dtype=_same,
           low=-8.0, high=8.0),
    OpSpec("silu", lambda a: gk.silu(a), lambda a: a / (1.0 + np.exp(-a)), dtypes=FLOATS, out_dtype=_same,
           low=-6.0, high=6.0),
    OpSpec("gelu", lambda a: gk.gelu(a), lambda a: 0.5 * a * (1.0 + _erf(a / math.sqrt(2.0))),
           dtypes=FLOATS, out_dtype=_same, low=-5.0, high=5.0),
    OpSpec("gelu_tanh", lambda a: gk.gelu(a, approximate="tanh"),
           lambda a: 0.5 * a * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a ** 3))),
           dtypes=FLOATS, out_dtype=_same, low=-5.0, high=5.0),
    OpSpec("gelu_tanh", lambda a: gk.gelu_tanh(a),
           lambda a: 0.5 * a * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a ** 3))),
           id="gelu_tanh_fn", dtypes=("float32",), layouts=("size7", "size4097")),
    # ---- clamp, where ----
    OpSpec("clamp", lambda a: gk.clamp(a, -1.0, 1.5), lambda a: np.clip(a, -1.0, 1.5), dtypes=FLOATS, out_dtype=_same, exact=True),
    OpSpec("clamp", lambda a: gk.clamp(a, -2, 3), lambda a: np.clip(a, -2, 3), id="clamp_int",
           dtypes=("int32", "int8", "int64"), out_dtype=_same, exact=True),
    OpSpec("clamp", lambda a: gk.clamp(a, min=0.25), lambda a: np.maximum(a, 0.25), id="clamp_min",
           dtypes=("float32", "bfloat16"), exact=True),
    OpSpec("clamp", lambda a: gk.clamp(a, max=0.25), lambda a: np.minimum(a, 0.25), id="clamp_max",
           dtypes=("float32", "float16"), exact=True),
    OpSpec("where", lambda c, a, b: gk.where(c, a, b), lambda c, a, b: np.where(c != 0, a, b), nin=3,
           dtypes=("float32", "bfloat16", "float8_e5m2", "int64", "int8", "bool", "float64"),
           in_dtypes=lambda dt: ("bool", dt, dt), out_dtype=_same, exact=True),
    OpSpec("where", lambda c, a, b: gk.where(c, a, b), lambda c, a, b: np.where(c != 0, a, b), nin=3,
           id="where_promote", dtypes=("float32",), in_dtypes=lambda dt: ("bool", "int32", "float16"),
           out_dtype=lambda dt: "float16", layouts=("size7", "broadcast"), low=-20, high=20, exact=True),
    OpSpec("where", lambda c, a: gk.where(c, a, 0.0), lambda c, a: np.where(c != 0, a, 0.0), nin=2,
           id="where_scalar", dtypes=("float32",), in_dtypes=lambda dt: ("bool", dt), layouts=("size7", "broadcast"),
           exact=True),
    # ---- copies, conversions, factories ----
    OpSpec("copy", lambda a: a.copy(), lambda a: a, dtypes=FLOATS + INTS + ("bool",), out_dtype=_same, exact=True),
    OpSpec("copy", lambda a: a.contiguous(), lambda a: a, id="contiguous", dtypes=("float32", "bfloat16"),
           exact=True),
    OpSpec("copy", lambda a: a.astype("float32"), lambda a: a, id="astype_to_f32",
           dtypes=("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "int32", "uint8", "bool", "float64"),
           out_dtype=lambda dt: "float32", exact=False),
    OpSpec("copy", lambda a: a.astype("bfloat16"), lambda a: a, id="astype_to_bf16",
           dtypes=("float32", "float16", "int8"), out_dtype=lambda dt: "bfloat16"),
    OpSpec("copy", lambda a: a.astype("float8_e4m3fn"), lambda a: a, id="astype_to_e4m3",
           dtypes=("float32", "bfloat16"), low=-600, high=600, out_dtype=lambda dt: "float8_e4m3fn"),
    OpSpec("copy", lambda a: a.astype("int32"), np.trunc, id="astype_to_i32", dtypes=("float32", "float16"),
           low=-100, high=100, out_dtype=lambda dt: "int32", exact=True),
    OpSpec("copy", lambda a: a.astype("bool"), lambda a: a != 0, id="astype_to_bool", dtypes=("float32", "int32"),
           gen=_logical, out_dtype=lambda dt: "bool", exact=True),
    OpSpec("fill", lambda a: gk.full(a.shape, 2.5, dtype=a.dtype, device=a.device), lambda a: np.full(a.shape, 2.5),
           shape_only=True, dtypes=("float32", "float64"), exact=True),
    OpSpec("fill", lambda a: gk.full(a.shape, 3, dtype=a.dtype, device=a.device), lambda a: np.full(a.shape, 3.0),
           id="fill_typed", shape_only=True, dtypes=("bfloat16", "float8_e5m2", "int8", "int64", "float16"),
           exact=True),
    OpSpec("fill", lambda a: gk.zeros(a.shape, dtype=a.dtype, device=a.device), lambda a: np.zeros(a.shape),
           id="zeros", shape_only=True, dtypes=("float32", "int32", "bool"), exact=True),
    OpSpec("arange", lambda a: gk.arange(0, a.shape[0] * 0.5, 0.5, dtype=a.dtype, device=a.device),
           lambda a: np.arange(a.shape[0]) * 0.5, shape_only=True, dtypes=("float32", "float64", "bfloat16")),
    OpSpec("arange", lambda a: gk.arange(a.shape[0], dtype=a.dtype, device=a.device),
           lambda a: np.arange(a.shape[0], dtype=np.float64), id="arange_int", shape_only=True,
           dtypes=("int32", "int64"), exact=True),
]
