"""Decode GEMV on the CPU backend against float64 NumPy: M = 1..8 and 1-d x, odd K and N,
strided weights, x converted to the weight dtype, out_dtype, M > 8 routed to linear, bad input.
The CUDA kernel (vector and scalar paths, split-K, determinism) is in test_gemv_cuda.py."""
import math

import ml_dtypes
import numpy as np
import pytest

import gpukit as gk

RNG = np.random.default_rng(77)
NP_DT = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
EPS = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def f64(x):
    return np.asarray(gk.to_numpy(x) if isinstance(x, gk.Array) else x).astype(np.float64)


def rand(shape, dtype, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(NP_DT[dtype])


def check_gemv(got, x, w, out):
    """x, w: the values the op sees (x already in w's dtype), float64 reference."""
    ref = f64(x) @ f64(w).T
    bound = np.abs(f64(x)) @ np.abs(f64(w)).T
    k = np.shape(w)[-1]
    g = f64(got)
    assert g.shape == ref.shape, (g.shape, ref.shape)
    tol = 2 * EPS[out] * np.abs(ref) + 2 * (k + 2) * 2.0**-24 * bound + 2.0**-126
    bad = ~(np.abs(g - ref) <= tol)
    assert not bad.any(), f"{bad.sum()} of {bad.size} out of tolerance"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("k,n", [(1, 1), (8, 3), (37, 9), (256, 17), (1000, 5)])
def test_gemv(dtype, m, k, n):
    x, w = rand((m, k), dtype), rand((n, k), dtype, 1 / math.sqrt(k))
    got = gk.gemv(gk.asarray(x), gk.asarray(w))
    assert got.dtype == getattr(gk, dtype) and got.shape == (m, n)
    check_gemv(got, x, w, dtype)


def test_gemv_1d_out_dtype_and_conversion():
    x32 = RNG.standard_normal(300).astype(np.float32)
    w = rand((7, 300), "bfloat16")
    got = gk.gemv(gk.asarray(x32), gk.asarray(w), out_dtype="float32")
    assert got.shape == (7,) and got.dtype == gk.float32
    xb = x32.astype(ml_dtypes.bfloat16)  # x is rounded to the weight dtype first
    check_gemv(got, xb, w, "float32")


def test_gemv_strided_weights_and_many_rows():
    wb = rand((9, 2, 64), "float16")
    w = gk.asarray(wb)[:, 1, :]                # row stride 128
    x = rand((4, 64), "float16")
    check_gemv(gk.gemv(gk.asarray(x), w), x, wb[:, 1, :], "float16")
    wt = gk.asarray(rand((64, 9), "float16")).T  # column stride != 1: copied
    check_gemv(gk.gemv(gk.asarray(x), wt), x, f64(wt), "float16")
    x12 = rand((12, 64), "float16")            # more than 8 rows: linear
    check_gemv(gk.gemv(gk.asarray(x12), w), x12, wb[:, 1, :], "float16")


def test_gemv_empty():
    assert gk.gemv(gk.zeros((2, 5), dtype="bfloat16"), gk.zeros((0, 5), dtype="bfloat16")).shape == (2, 0)
    got = gk.gemv(gk.zeros((2, 0), dtype="bfloat16"), gk.zeros((3, 0), dtype="bfloat16"))
    assert got.shape == (2, 3) and not f64(got).any()


def test_gemv_bad_input():
    w = gk.zeros((4, 8), dtype="bfloat16")
    with pytest.raises(TypeError, match="w"):
        gk.gemv(gk.zeros(8), gk.zeros((4, 8)))
    with pytest.raises(TypeError, match="x"):
        gk.gemv(gk.zeros(8, dtype="int32"), w)
    with pytest.raises(ValueError, match="features|columns"):
        gk.gemv(gk.zeros(7, dtype="bfloat16"), w)
    with pytest.raises(ValueError, match="w"):
        gk.gemv(gk.zeros(8, dtype="bfloat16"), gk.zeros(8, dtype="bfloat16"))
    with pytest.raises(ValueError, match="x"):
        gk.gemv(gk.zeros((1, 2, 8), dtype="bfloat16"), w)
    with pytest.raises(TypeError, match="out_dtype"):
        gk.gemv(gk.zeros(8, dtype="bfloat16"), w, out_dtype="float64")
