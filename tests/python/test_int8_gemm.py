"""W8A8 int8_linear: exact int32 products against NumPy int64, per-token / per-channel /
per-tensor scales and bias against float64, odd shapes and strided operands, bad input;
on CUDA (cuBLASLt's int8 GEMM or the fallback kernel) bit-identical to the CPU for the
int32 products. The quantize_int8 helper gives per-token scales of activations."""
import numpy as np
import pytest

import gpukit as gk

RNG = np.random.default_rng(808)
CUDA = gk.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU"))]


def i8(shape):
    return RNG.integers(-128, 128, size=shape, dtype=np.int64).astype(np.int8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 16, 5), (33, 64, 65), (128, 4096, 256), (5, 131071, 3),
                                   (64, 100, 1)])
def test_int32_products_exact(device, m, k, n):
    if device == "cpu" and m * k * n > 50_000_000:
        pytest.skip("slow on the CPU reference")
    x, w = i8((m, k)), i8((n, k))
    if k == 131071:  # the extreme: every product +128*128 stays below 2^31
        x[:] = -128
        w[:] = -128
    got = gk.int8_linear(gk.asarray(x).to(device), gk.asarray(w).to(device))
    assert got.dtype == gk.int32 and got.shape == (m, n)
    ref = x.astype(np.int64) @ w.astype(np.int64).T
    assert np.array_equal(gk.to_numpy(got).astype(np.int64), ref)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_and_batched_rows(device):
    xb, wb = i8((2, 3, 2, 48)), i8((40, 2, 48))
    x = gk.asarray(xb).to(device)[:, :, 1, :]   # [2, 3, 48], rows 96 apart
    w = gk.asarray(wb).to(device)[:, 0, :]      # rows 96 apart
    got = gk.int8_linear(x, w)
    ref = xb[:, :, 1, :].astype(np.int64) @ wb[:, 0, :].astype(np.int64).T
    assert got.shape == (2, 3, 40) and np.array_equal(gk.to_numpy(got), ref)
    wt = gk.asarray(np.ascontiguousarray(wb[:, 0, :].T)).to(device).T  # column-major w
    assert np.array_equal(gk.to_numpy(gk.int8_linear(x, wt)), ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out", ["float32", "bfloat16", "float16"])
def test_scaled_w8a8(device, out):
    xf = RNG.standard_normal((9, 256)).astype(np.float32)
    wf = RNG.standard_normal((31, 256)).astype(np.float32)
    xq, xs = gk.quantize_int8(gk.asarray(xf))   # per token
    wq, ws = gk.quantize_int8(gk.asarray(wf))   # per output channel
    bias = RNG.standard_normal(31).astype(np.float32)
    got = gk.int8_linear(xq.to(device), wq.to(device), x_scale=xs.to(device), w_scale=ws.to(device),
                         bias=gk.asarray(bias).to(device), out_dtype=out)
    assert got.dtype == getattr(gk, out)
    acc = gk.to_numpy(xq).astype(np.int64) @ gk.to_numpy(wq).astype(np.int64).T
    b_out = gk.to_numpy(gk.asarray(bias).astype(out)).astype(np.float64)
    ref = acc * gk.to_numpy(xs).astype(np.float64)[:, None] * gk.to_numpy(ws).astype(np.float64)[None, :] + b_out
    eps = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}[out]
    tol = 2 * eps * np.abs(ref) + 8 * 2.0**-24 * (np.abs(ref) + np.abs(b_out)) + 1e-30
    assert np.all(np.abs(gk.to_numpy(got).astype(np.float64) - ref) <= tol)
    # and it approximates the float product
    assert np.allclose(gk.to_numpy(got).astype(np.float64), xf.astype(np.float64) @ wf.T + b_out, rtol=0.1, atol=0.5)
    # per-tensor scales: one number each
    got1 = gk.int8_linear(xq.to(device), wq.to(device), x_scale=gk.asarray(np.float32(0.5)).to(device),
                          w_scale=gk.asarray(np.array([0.25], np.float32)).to(device))
    assert np.array_equal(gk.to_numpy(got1), (acc * 0.125).astype(np.float32))


def test_int8_linear_bad_input():
    x, w = gk.zeros((3, 8), dtype="int8"), gk.zeros((4, 8), dtype="int8")
    with pytest.raises(TypeError, match="x"):
        gk.int8_linear(gk.zeros((3, 8)), w)
    with pytest.raises(TypeError, match="w"):
        gk.int8_linear(x, gk.zeros((4, 8)))
    with pytest.raises(ValueError, match="features|columns"):
        gk.int8_linear(x, gk.zeros((4, 7), dtype="int8"))
    with pytest.raises(ValueError, match="x_scale, w_scale"):
        gk.int8_linear(x, w, x_scale=gk.ones(3))
    with pytest.raises(ValueError, match="bias"):
        gk.int8_linear(x, w, bias=gk.ones(4))
    with pytest.raises(ValueError, match="x_scale"):
        gk.int8_linear(x, w, x_scale=gk.ones(2), w_scale=gk.ones(4))
    with pytest.raises(ValueError, match="w_scale"):
        gk.int8_linear(x, w, x_scale=gk.ones(3), w_scale=gk.ones(3))
    with pytest.raises(ValueError, match="overflow"):
        gk.int8_linear(gk.zeros((1, 131072), dtype="int8"), gk.zeros((1, 131072), dtype="int8"))
    with pytest.raises(TypeError, match="out_dtype"):
        gk.int8_linear(x, w, out_dtype="float32")


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("m,k,n", [(1, 16, 1), (7, 16, 5), (128, 64, 128), (129, 4096, 257), (300, 1008, 100),
                                   (2, 131056, 3), (256, 48, 640)])
def test_gpukit_int8_tensor_core_kernel_exact(monkeypatch, m, k, n):
    """GPUKIT_INT8_GEMM=gpukit: gpukit's mma.sync kernel (src/cuda/int8_gemm.cu) first; exact."""
    monkeypatch.setenv("GPUKIT_INT8_GEMM", "gpukit")
    x, w = i8((m, k)), i8((n, k))
    if k == 131056:
        x[:] = -128
        w[:] = -128
    before = gk.linalg.cublaslt_info()["lt_calls"]
    got = gk.int8_linear(gk.asarray(x).to("cuda"), gk.asarray(w).to("cuda"))
    assert gk.linalg.cublaslt_info()["lt_calls"] == before, "cuBLASLt ran instead of gpukit's kernel"
    ref = x.astype(np.int64) @ w.astype(np.int64).T
    g = gk.to_numpy(got).astype(np.int64)
    bad = g != ref
    assert not bad.any(), f"{bad.sum()} of {bad.size} wrong, first at {np.argwhere(bad)[0]}"
    # a strided view of x (rows 2k apart, still 16-byte aligned) and the W8A8 epilogue on top
    xb = i8((m, 2, k))
    xs = gk.asarray(xb).to("cuda")[:, 1, :]
    got = gk.int8_linear(xs, gk.asarray(w).to("cuda"))
    assert np.array_equal(gk.to_numpy(got).astype(np.int64), xb[:, 1, :].astype(np.int64) @ w.astype(np.int64).T)
