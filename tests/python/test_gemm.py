"""matmul options (out_dtype, allow_tf32, precision), linear with fused epilogues and
gate_up_swiglu on the CPU backend against float64 NumPy; bad input. The CUDA
paths (cuBLASLt and the fallback kernel) are in test_gemm_cuda.py."""
import math

import ml_dtypes
import numpy as np
import pytest

import gpukit as gk

RNG = np.random.default_rng(2026)
NP_DT = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float64": np.float64}
EPS = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8, "float64": 2.0**-53}
TINY = {"float32": 2.0**-126, "float16": 2.0**-14, "bfloat16": 2.0**-126, "float64": 2.0**-1000}


def rand(shape, dtype, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(NP_DT[dtype])


def f64(x):
    return np.asarray(gk.to_numpy(x) if isinstance(x, gk.Array) else x).astype(np.float64)


def to_dt(x, dtype):
    """float64 values rounded to `dtype` (as float64)."""
    return np.asarray(x, dtype=np.float64).astype(NP_DT[dtype]).astype(np.float64)


ERF = np.vectorize(math.erf, otypes=[np.float64])


def act_ref(v, act):
    if act is None:
        return v
    if act == "gelu":
        return 0.5 * v * (1 + ERF(v / math.sqrt(2)))
    if act == "gelu_tanh":
        return 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
    if act == "silu":
        return v / (1 + np.exp(-v))
    raise AssertionError(act)


def linear_ref(x, w, bias, act, res, out):
    """Reference in float64: bias and residual rounded to the output dtype first."""
    acc = f64(x) @ f64(w).T
    bound = np.abs(f64(x)) @ np.abs(f64(w)).T
    v = acc + (to_dt(f64(bias), out) if bias is not None else 0)
    y = act_ref(v, act)
    if res is not None:
        y = y + to_dt(f64(res), out)
    return y, bound


def assert_close(got, ref, bound, k, out, acc_eps=2.0**-24, deriv=1.2):
    g = f64(got)
    assert g.shape == ref.shape, (g.shape, ref.shape)
    tol = 2 * EPS[out] * np.abs(ref) + deriv * 2 * (k + 4) * acc_eps * (bound + np.abs(ref)) + TINY[out]
    bad = ~(np.abs(g - ref) <= tol)
    if bad.any():
        ex = np.where(np.isnan(g), np.inf, np.abs(g - ref) - tol)
        w = np.unravel_index(int(np.argmax(ex)), ex.shape)
        first = np.unravel_index(int(np.argmax(bad)), bad.shape)
        raise AssertionError(f"{bad.sum()} of {bad.size} out of tolerance; worst excess {ex[w]:.3g} at {w}: got "
                             f"{g[w]!r}, ref {ref[w]!r}, tol {tol[w]:.3g}, bound {np.broadcast_to(bound, ref.shape)[w]:.3g}"
                             f"; first at {first}")


# ---------------------------------------------------------------- matmul options

@pytest.mark.parametrize("dt,out", [("bfloat16", "float32"), ("float16", "float32"), ("float32", "bfloat16"),
                                    ("float32", "float16"), ("bfloat16", "float16"), ("float64", "float32"),
                                    ("float64", "float64"), ("float16", "bfloat16")])
def test_matmul_out_dtype(dt, out):
    a, b = rand((2, 7, 33), dt), rand((33, 19), dt)
    got = gk.matmul(gk.asarray(a), gk.asarray(b), out_dtype=out)
    assert got.dtype == getattr(gk, out)
    ref = f64(a) @ f64(b)
    acc_eps = 2.0**-53 if dt == "float64" else 2.0**-24
    assert_close(got, ref, np.abs(f64(a)) @ np.abs(f64(b)), 33, out, acc_eps, deriv=1.0)


def test_matmul_out_dtype_rounded_once():
    # bf16 inputs with an fp32 result keep the full fp32 accumulation (not a bf16-rounded value)
    a = np.full((1, 3), 1 + 2.0**-7, dtype=ml_dtypes.bfloat16)
    b = np.full((3, 1), 1 + 2.0**-7, dtype=ml_dtypes.bfloat16)
    got = f64(gk.matmul(gk.asarray(a), gk.asarray(b), out_dtype="float32"))
    assert got[0, 0] == 3 * (1 + 2.0**-7) ** 2


def test_matmul_bad_options():
    a = gk.asarray(rand((3, 4), "float32"))
    with pytest.raises(TypeError, match="out_dtype"):
        gk.matmul(a, a.T, out_dtype="float64")
    with pytest.raises(TypeError, match="out_dtype"):
        gk.matmul(a, a.T, out_dtype="int32")
    with pytest.raises(TypeError, match="allow_tf32"):
        gk.matmul(a, a.T, allow_tf32="yes")
    with pytest.raises(ValueError, match="precision"):
        gk.set_matmul_precision("medium")
    assert gk.get_matmul_precision() == "highest"


def test_precision_context_and_cpu_is_true_fp32():
    a, b = rand((5, 2000), "float32"), rand((2000, 3), "float32")
    ref = f64(a) @ f64(b)
    bound = np.abs(f64(a)) @ np.abs(f64(b))
    with gk.matmul_precision("tf32"):
        assert gk.get_matmul_precision() == "tf32"
        got = gk.matmul(gk.asarray(a), gk.asarray(b))
    assert gk.get_matmul_precision() == "highest"
    # the CPU reference computes true fp32 even when TF32 is allowed
    assert_close(got, ref, bound, 2000, "float32", deriv=1.0)
    got2 = gk.matmul(gk.asarray(a), gk.asarray(b), allow_tf32=True)
    assert np.array_equal(gk.to_numpy(got), gk.to_numpy(got2))
    with pytest.raises(RuntimeError):
        with gk.matmul_precision("tf32"):
            raise RuntimeError("restored on error")
    assert gk.get_matmul_precision() == "highest"


def test_matmul_still_numpy_semantics():
    a, b = rand((4,), "float32"), rand((3, 4, 2), "float32")
    got = gk.matmul(gk.asarray(a), gk.asarray(b), out_dtype="float32")
    assert got.shape == np.matmul(a, b).shape
    assert (gk.asarray(a) @ gk.asarray(b)).shape == (3, 2)
    got = gk.matmul(a, gk.asarray(b))  # NumPy operand converted
    assert got.shape == (3, 2)


# ---------------------------------------------------------------- linear

LIN_SHAPES = [((1, 1), 1), ((3, 17), 5), ((2, 3, 33), 7), ((65,), 129), ((4, 1, 8), 1)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("act", [None, "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("use_bias,use_res", [(False, False), (True, False), (False, True), (True, True)])
def test_linear(dtype, act, use_bias, use_res):
    for xs, n in LIN_SHAPES:
        k = xs[-1]
        x, w = rand(xs, dtype), rand((n, k), dtype, 1 / math.sqrt(k))
        bias = rand((n,), dtype) if use_bias else None
        res = rand(xs[:-1] + (n,), dtype) if use_res else None
        got = gk.linear(gk.asarray(x), gk.asarray(w), bias=None if bias is None else gk.asarray(bias),
                        activation=act, residual=None if res is None else gk.asarray(res))
        assert got.dtype == getattr(gk, dtype)
        ref, bound = linear_ref(x, w, bias, act, res, dtype)
        acc_eps = 2.0**-53 if dtype == "float64" else 2.0**-24
        assert_close(got, ref, bound, k, dtype, acc_eps)


@pytest.mark.parametrize("out", ["float32", "bfloat16"])
def test_linear_out_dtype_and_mixed_inputs(out):
    x, w = rand((5, 40), "bfloat16"), rand((9, 40), "float32")
    bias, res = rand((9,), "float32"), rand((5, 9), "float16")
    got = gk.linear(gk.asarray(x), gk.asarray(w), bias=gk.asarray(bias), activation="silu",
                    residual=gk.asarray(res), out_dtype=out)
    assert got.dtype == getattr(gk, out)
    ref, bound = linear_ref(x, w, bias, "silu", res, out)
    assert_close(got, ref, bound, 40, out)


def test_linear_strided_operands():
    xb, wb = rand((40, 2, 31), "float32"), rand((31, 2, 23), "float32")
    x = gk.asarray(xb)[:, 1, :]          # rows 62 elements apart
    w = gk.asarray(wb)[:, 0, :].T        # [23, 31] with column stride 46
    xn, wn = xb[:, 1, :], wb[:, 0, :].T
    bias = gk.asarray(rand((46,), "float32"))[::2]
    got = gk.linear(x, w, bias=bias, activation="gelu")
    ref, bound = linear_ref(xn, wn, f64(bias), "gelu", None, "float32")
    assert_close(got, ref, bound, 31, "float32")
    # x that cannot be viewed as rows (transposed batch) is copied first
    x3 = gk.asarray(rand((31, 4, 6), "float32")).permute([1, 2, 0])
    got = gk.linear(x3, w)
    ref, bound = linear_ref(f64(x3), wn, None, None, None, "float32")
    assert_close(got, ref, bound, 31, "float32")


def test_linear_empty_and_k0():
    w = gk.asarray(rand((4, 0), "float32"))
    b = rand((4,), "float32")
    got = gk.linear(gk.zeros((3, 0)), w, bias=gk.asarray(b), activation="silu")
    np.testing.assert_allclose(f64(got), np.broadcast_to(act_ref(f64(b), "silu"), (3, 4)), rtol=1e-6)
    assert gk.linear(gk.zeros((0, 5)), gk.zeros((4, 5))).shape == (0, 4)
    assert gk.linear(gk.zeros((2, 0, 5)), gk.zeros((4, 5))).shape == (2, 0, 4)


def test_linear_bad_input():
    x, w = gk.zeros((3, 5)), gk.zeros((4, 5))
    with pytest.raises(ValueError, match="w"):
        gk.linear(x, gk.zeros(5))
    with pytest.raises(ValueError, match="features|columns"):
        gk.linear(x, gk.zeros((4, 6)))
    with pytest.raises(ValueError, match="bias"):
        gk.linear(x, w, bias=gk.zeros(5))
    with pytest.raises(ValueError, match="residual"):
        gk.linear(x, w, residual=gk.zeros((3, 5)))
    with pytest.raises(ValueError, match="activation"):
        gk.linear(x, w, activation="relu6")
    with pytest.raises(TypeError, match="activation"):
        gk.linear(x, w, activation=3)
    with pytest.raises(TypeError, match="x"):
        gk.linear(gk.zeros((3, 5), dtype=gk.int32), w)
    with pytest.raises(TypeError, match="bias"):
        gk.linear(x, w, bias=gk.zeros(4, dtype=gk.int8))
    with pytest.raises(TypeError, match="out_dtype"):
        gk.linear(x, w, out_dtype="float64")
    with pytest.raises(ValueError, match="x"):
        gk.linear(gk.asarray(np.float32(1.0)), w)


# ---------------------------------------------------------------- gate_up_swiglu

@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("xs,i", [((1, 1), 1), ((3, 33), 17), ((2, 2, 64), 40)])
def test_gate_up_swiglu(dtype, xs, i):
    k = xs[-1]
    x, w = rand(xs, dtype), rand((2 * i, k), dtype, 1 / math.sqrt(k))
    got = gk.gate_up_swiglu(gk.asarray(x), gk.asarray(w))
    assert got.shape == xs[:-1] + (i,) and got.dtype == getattr(gk, dtype)
    g = f64(x) @ f64(w)[:i].T
    u = f64(x) @ f64(w)[i:].T
    ref = act_ref(g, "silu") * u
    bg = np.abs(f64(x)) @ np.abs(f64(w)[:i]).T
    bu = np.abs(f64(x)) @ np.abs(f64(w)[i:]).T
    bound = bg * np.abs(u) + bu * np.abs(g) + bg * bu
    acc_eps = 2.0**-53 if dtype == "float64" else 2.0**-24
    assert_close(got, ref, bound, k, dtype, acc_eps, deriv=1.5)


def test_gate_up_swiglu_out_dtype_and_bad_input():
    x, w = rand((3, 8), "bfloat16"), rand((6, 8), "bfloat16")
    got = gk.gate_up_swiglu(gk.asarray(x), gk.asarray(w), out_dtype="float32")
    assert got.dtype == gk.float32
    with pytest.raises(ValueError, match="even"):
        gk.gate_up_swiglu(gk.zeros((3, 8)), gk.zeros((5, 8)))
    with pytest.raises(ValueError, match="features|columns"):
        gk.gate_up_swiglu(gk.zeros((3, 8)), gk.zeros((6, 7)))
    with pytest.raises(ValueError, match="w_gate_up"):
        gk.gate_up_swiglu(gk.zeros((3, 8)), gk.zeros((2, 3, 8)))


def test_registered():
    ops = {name: (cpu, cuda) for name, cpu, cuda in gk.registered_ops()}
    for name in ("matmul", "linear", "gate_up_swiglu"):
        assert name in ops and ops[name][0], name


def test_cublaslt_info_shape():
    info = gk.linalg.cublaslt_info()
    for key in ("available", "path", "reason", "version", "lt_calls", "fallback_calls", "plans", "no_algo"):
        assert key in info
    if not gk.cuda.is_available():
        assert info["lt_calls"] == 0
