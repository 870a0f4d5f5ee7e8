"""fp8_linear (e4m3 operands, per-tensor scales): against float64 products of the exact fp8
values, with and without bias, output dtypes, strided rows, bad input; on CUDA (cuBLASLt's
FP8 GEMM without bias, the general path with bias) against the same reference."""
import ml_dtypes
import numpy as np
import pytest

import gpukit as gk

RNG = np.random.default_rng(909)
CUDA = gk.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU"))]
EPS = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


def fp8(shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out", ["bfloat16", "float32", "float16"])
@pytest.mark.parametrize("m,k,n", [(1, 16, 16), (7, 64, 33), (128, 1024, 256), (3, 4096, 8)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fp8_linear(device, out, m, k, n, with_bias):
    x, w = fp8((m, k)), fp8((n, k), 0.05)
    xs, ws = np.float32(0.75), np.float32(1.5)
    bias = RNG.standard_normal(n).astype(np.float32) if with_bias else None
    got = gk.fp8_linear(gk.asarray(x).to(device), gk.asarray(w).to(device), gk.asarray(xs).to(device),
                        gk.asarray(np.array([ws])).to(device),
                        bias=None if bias is None else gk.asarray(bias).to(device), out_dtype=out)
    assert got.dtype == getattr(gk, out) and got.shape == (m, n)
    xf, wf = x.astype(np.float64), w.astype(np.float64)
    b = 0 if bias is None else bias.astype(getattr(np, "float32")).astype(
        {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float16": np.float16}[out]).astype(np.float64)
    ref = (xf @ wf.T) * float(xs) * float(ws) + b
    bound = (np.abs(xf) @ np.abs(wf).T) * float(xs) * float(ws) + np.abs(b)
    tol = 2 * EPS[out] * np.abs(ref) + 2 * (k + 4) * 2.0**-24 * bound + 1e-30
    assert np.all(np.abs(gk.to_numpy(got).astype(np.float64) - ref) <= tol)
    if device == "cuda":
        again = gk.fp8_linear(gk.asarray(x).to(device), gk.asarray(w).to(device), gk.asarray(xs).to(device),
                              gk.asarray(np.array([ws])).to(device),
                              bias=None if bias is None else gk.asarray(bias).to(device), out_dtype=out)
        assert gk.to_numpy(again).tobytes() == gk.to_numpy(got).tobytes()


def test_fp8_linear_bad_input():
    x = gk.asarray(fp8((3, 16)))
    w = gk.asarray(fp8((4, 16)))
    one = gk.ones(1)
    with pytest.raises(TypeError, match="x"):
        gk.fp8_linear(gk.zeros((3, 16)), w, one, one)
    with pytest.raises(ValueError, match="features|columns"):
        gk.fp8_linear(x, gk.asarray(fp8((4, 8))), one, one)
    with pytest.raises(ValueError, match="x_scale"):
        gk.fp8_linear(x, w, gk.ones(3), one)
    with pytest.raises(ValueError, match="x_scale, w_scale"):
        gk.fp8_linear(x, w, None, one)
    with pytest.raises(ValueError, match="bias"):
        gk.fp8_linear(x, w, one, one, bias=gk.ones(5))
    with pytest.raises(TypeError, match="out_dtype"):
        gk.fp8_linear(x, w, one, one, out_dtype="int32")
