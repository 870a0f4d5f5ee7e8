"""swiglu, geglu (erf and tanh) and relu2, on two inputs and on one [..., 2I] tensor."""
import math

import numpy as np
import pytest

import gpukit as gk

CUDA = gk.cuda.is_available()
DTYPES = ["float32", "float16", "bfloat16"]
TOL = {"float32": 2e-6, "float16": 1e-3, "bfloat16": 8e-3}
_erf = np.vectorize(math.erf)


def make(shape, dtype, seed=0, scale=3.0):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale
    return gk.asarray(a).astype(dtype)


def f64(x):
    return np.asarray(gk.to_numpy(x), dtype=np.float64)


def ref(act, g, u):
    if act == "swiglu":
        return g / (1.0 + np.exp(-g)) * u
    if act == "geglu":
        return 0.5 * g * (1.0 + _erf(g / math.sqrt(2.0))) * u
    if act == "geglu_tanh":
        return 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3))) * u
    return np.maximum(g, 0.0) ** 2


def call(act, g, u=None):
    if act == "swiglu":
        return gk.nn.swiglu(g, u)
    if act == "geglu":
        return gk.nn.geglu(g, u)
    if act == "geglu_tanh":
        return gk.nn.geglu(g, u, approximate="tanh")
    return gk.nn.relu2(g)


def close(got, want, dtype):
    t = TOL[dtype]
    np.testing.assert_allclose(f64(got), want, rtol=t, atol=t)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["swiglu", "geglu", "geglu_tanh", "relu2"])
@pytest.mark.parametrize("shape", [(1,), (3, 7), (2, 3, 64), (5, 1001)])
def test_two_inputs(dtype, act, shape):
    g, u = make(shape, dtype, 1), make(shape, dtype, 2)
    y = call(act, g, None if act == "relu2" else u)
    assert y.shape == g.shape and y.dtype == g.dtype
    close(y, ref(act, f64(g), f64(u)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["swiglu", "geglu", "geglu_tanh"])
@pytest.mark.parametrize("shape", [(1, 2), (3, 14), (2, 3, 128), (4, 2002)])
def test_fused(dtype, act, shape):
    x = make(shape, dtype, 3)
    y = call(act, x)
    I = shape[-1] // 2
    assert y.shape == shape[:-1] + (I,)
    xv = f64(x)
    close(y, ref(act, xv[..., :I], xv[..., I:]), dtype)


def test_strided_and_extremes():
    base = make((6, 5, 48), "float32", 4)
    g, u = base[:, 1, :], base[:, 3, :]
    close(gk.nn.swiglu(g, u), ref("swiglu", f64(g), f64(u)), "float32")
    gt = base[:, :, 0]  # last dim strided
    close(gk.nn.relu2(gt), ref("relu2", f64(gt), None), "float32")
    big = gk.asarray(np.array([[-1e4, 1e4, -100.0, 0.0, 2.0, 3.0, 4.0, 5.0]], np.float32))
    y = f64(gk.nn.swiglu(big))
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y, ref("swiglu", f64(big)[:, :4], f64(big)[:, 4:]), rtol=1e-6, atol=1e-30)


def test_bad_inputs():
    g = make((2, 8), "float32")
    with pytest.raises(TypeError, match="up: dtype"):
        gk.nn.swiglu(g, g.astype("float16"))
    with pytest.raises(ValueError, match="up: shape"):
        gk.nn.swiglu(g, make((2, 7), "float32"))
    with pytest.raises(ValueError, match="even"):
        gk.nn.swiglu(make((2, 7), "float32"))
    with pytest.raises(ValueError, match="approximate"):
        gk.nn.geglu(g, g, approximate="fast")
    with pytest.raises(TypeError, match="x: dtype"):
        gk.nn.relu2(g.astype("int64"))


gpu = pytest.mark.skipif(not CUDA, reason="no CUDA device")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["swiglu", "geglu", "geglu_tanh", "relu2"])
@pytest.mark.parametrize("shape", [(1, 6), (33, 7), (17, 64), (5, 4096), (3, 1000003 // 1000)])
def test_cuda_matches_cpu(dtype, act, shape):
    g, u = make(shape, dtype, 1), make(shape, dtype, 2)
    t = TOL[dtype] * 2
    uu = None if act == "relu2" else u
    np.testing.assert_allclose(f64(call(act, g.to("cuda"), None if uu is None else uu.to("cuda"))),
                               f64(call(act, g, uu)), rtol=t, atol=t)
    if act != "relu2" and shape[-1] % 2 == 0:
        np.testing.assert_allclose(f64(call(act, g.to("cuda"))), f64(call(act, g)), rtol=t, atol=t)
    # misaligned view: scalar path
    gv = g.to("cuda")[:, 1:]
    if gv.shape[-1] and act != "relu2":
        uv = u.to("cuda")[:, 1:]
        np.testing.assert_allclose(f64(call(act, gv, uv)), f64(call(act, g[:, 1:], u[:, 1:])), rtol=t, atol=t)


@gpu
def test_cuda_deterministic():
    x = make((64, 2 * 4096), "bfloat16", 1).to("cuda")
    a, b = gk.to_numpy(gk.nn.swiglu(x)), gk.to_numpy(gk.nn.swiglu(x))
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
