"""NVF4 weights (e2m1 codes, e4m3 scales per 16 weights, an fp32 tensor scale): the
quantization rule against an independent NumPy implementation, exact dequantization, the
GEMV (CPU; CUDA when present) against float64 products with the exactly dequantized
weights, odd shapes, bad input. CUDA-only layout errors are in the CUDA test below."""
import ml_dtypes
import numpy as np
import pytest

import gpukit as gk

RNG = np.random.default_rng(808)
CUDA = gk.cuda.is_available()
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)


def f64(x):
    return np.asarray(gk.to_numpy(x) if isinstance(x, gk.Array) else x).astype(np.float64)


def np_e2m1_code(v):
    """Nearest e2m1 magnitude, ties to the even code, saturating at 6; sign in bit 3."""
    a = np.abs(v.astype(np.float64))
    d = np.abs(a[..., None] - E2M1)  # distances to the 8 magnitudes
    best = d.min(-1, keepdims=True)
    ties = d == best
    # among the nearest codes prefer the even one (at most two are nearest)
    code = np.where(ties[..., ::2].any(-1), np.argmax(ties & (np.arange(8) % 2 == 0), -1), np.argmax(ties, -1))
    return np.where((code != 0) & (v < 0), code | 8, code).astype(np.uint8)


def np_nvf4(w):
    n, k = w.shape
    amax = np.float32(np.abs(w).max())
    ts = np.float32(amax / np.float32(6 * 448))
    if not ts > 0:
        ts = np.float32(1)
    wb = w.reshape(n, k // 16, 16)
    bmax = np.abs(wb).max(-1)
    bs = ((bmax / np.float32(6)).astype(np.float32) / ts).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    s = (bs.astype(np.float32) * ts).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(s[..., None] > 0, (wb / s[..., None]).astype(np.float32), 0).astype(np.float32)
    codes = np_e2m1_code(r).reshape(n, k)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, bs, ts, codes


def np_deq(codes, bs, ts):
    n, k = codes.shape
    mag = E2M1[codes & 7] * np.where(codes & 8, -1, 1)
    v = (mag.reshape(n, k // 16, 16).astype(np.float32) * bs.astype(np.float32)[..., None]).astype(np.float32)
    return (v * np.float32(ts)).astype(np.float32).reshape(n, k).astype(np.float64)


W = (RNG.standard_normal((9, 96)) * np.linspace(0.01, 3, 9)[:, None]).astype(np.float32)
W[4, :16] = 0          # an all-zero block
W[5, 3] = 40.0         # an outlier sets the tensor scale


def test_quantize_rule_and_exact_dequant():
    q, bs, ts = gk.quantize_nvf4(gk.asarray(W))
    assert q.dtype == gk.uint8 and q.shape == (9, 48)
    assert bs.dtype == gk.float8_e4m3fn and bs.shape == (9, 6)
    assert ts.dtype == gk.float32 and ts.shape == (1,)
    pr, bsr, tsr, codes = np_nvf4(W)
    assert np.float32(gk.to_numpy(ts)[0]) == tsr
    assert np.array_equal(gk.to_numpy(bs).view(np.uint8), bsr.view(np.uint8))
    assert np.array_equal(gk.to_numpy(q), pr)
    d = f64(gk.dequantize_nvf4(q, bs, ts))
    assert np.array_equal(d, np_deq(codes, bsr, tsr))
    # within half a step of the block's grid (the largest step is 2 * block scale)
    step = 2 * np.repeat(bsr.astype(np.float64), 16, axis=1) * float(tsr)
    assert np.all(np.abs(d - W) <= 0.5 * step + 1e-12)


def test_e2m1_ties_to_even():
    # tensor max 2688 = 6 * 448 gives tensor scale 1; a block with max 6 gives block scale 1,
    # so w / s is exactly the row: midpoints go to the even code
    row = np.array([6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.75, -5, 0, 5.5, -6, 0.1, 0.6, 2.9], np.float32)
    want = np.array([7, 0, 2, 2, 4, 4, 6, 6, 10, 14, 0, 7, 15, 0, 1, 5], np.uint8)
    w = np.zeros((2, 16), np.float32)
    w[0] = row
    w[1, 0] = 2688
    q, bs, ts = gk.quantize_nvf4(gk.asarray(w))
    assert gk.to_numpy(ts)[0] == 1.0 and float(gk.to_numpy(bs.astype("float32"))[0, 0]) == 1.0
    got = gk.to_numpy(q)[0]
    codes = np.stack([got & 15, got >> 4], axis=1).reshape(16)
    assert np.array_equal(codes, want), codes
    assert np.array_equal(np_e2m1_code(row), want)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no GPU"))])
@pytest.mark.parametrize("m,n,k", [(1, 5, 32), (3, 33, 96), (8, 65, 4096), (2, 300, 14336), (4, 1, 160)])
def test_gemv_nvf4(dtype, device, m, n, k):
    if device == "cpu" and n * k > 1_000_000:
        pytest.skip("the CPU reference is slow at this size")
    w = (RNG.standard_normal((n, k)) * 0.05).astype(np.float32)
    q, bs, ts = gk.quantize_nvf4(gk.asarray(w))
    deq = f64(gk.dequantize_nvf4(q, bs, ts))
    x = gk.asarray(RNG.standard_normal((m, k)).astype(np.float32)).astype(dtype)
    got = gk.gemv_nvf4(x.to(device), q.to(device), bs.to(device), ts.to(device), out_dtype="float32")
    ref = f64(x) @ deq.T
    bound = np.abs(f64(x)) @ np.abs(deq).T
    err = np.abs(f64(got) - ref)
    tol = 2 * (k + 2) * 2.0**-24 * bound + 1e-30
    if not np.all(err <= tol):
        i = np.unravel_index(np.argmax(err / tol), err.shape)
        raise AssertionError(f"nvf4 {device} y{list(i)} = {f64(got)[i]!r}, ref {ref[i]!r}, tol {tol[i]:.3g}")
    y16 = gk.gemv_nvf4(x.to(device), q.to(device), bs.to(device), ts.to(device))
    assert y16.dtype == getattr(gk, dtype)
    if device == "cuda":
        again = gk.gemv_nvf4(x.to(device), q.to(device), bs.to(device), ts.to(device), out_dtype="float32")
        assert gk.to_numpy(again).tobytes() == gk.to_numpy(got).tobytes()
        cpu = gk.gemv_nvf4(x, q, bs, ts, out_dtype="float32") if n * k <= 1_000_000 else None
        if cpu is not None:
            np.testing.assert_allclose(f64(got), f64(cpu), rtol=1e-4, atol=1e-5)


def test_nvf4_bad_input():
    q, bs, ts = gk.quantize_nvf4(gk.asarray(W))
    x = gk.zeros((1, 96), dtype="bfloat16")
    with pytest.raises(ValueError, match="block size 16|divisible"):
        gk.quantize_nvf4(gk.zeros((2, 40)))
    with pytest.raises(ValueError, match="tensor_scale"):
        gk.gemv_nvf4(x, q, bs, None)
    with pytest.raises(ValueError, match="scales"):
        gk.gemv_nvf4(x, q, None, ts)
    with pytest.raises(ValueError, match="scales"):
        gk.gemv_nvf4(x, q, bs[:, :5], ts)
    with pytest.raises(TypeError, match="scales"):
        gk.gemv_nvf4(x, q, bs.astype("float32"), ts)
    with pytest.raises(TypeError, match="tensor_scale"):
        gk.gemv_nvf4(x, q, bs, gk.zeros(2))
    with pytest.raises(TypeError, match="q"):
        gk.gemv_nvf4(x, q.view_dtype("int8"), bs, ts)
    with pytest.raises(ValueError, match="features|K"):
        gk.gemv_nvf4(gk.zeros((1, 95), dtype="bfloat16"), q, bs, ts)


@pytest.mark.skipif(not CUDA, reason="no GPU")
def test_nvf4_cuda_layout_errors():
    w = gk.asarray((RNG.standard_normal((4, 48)) * 0.1).astype(np.float32))
    q, bs, ts = gk.quantize_nvf4(w)  # K = 48: not a multiple of the 32-weight CUDA chunk
    with pytest.raises(ValueError, match="divisible by 32"):
        gk.gemv_nvf4(gk.zeros((1, 48), dtype="bfloat16", device="cuda"), q.to("cuda"), bs.to("cuda"), ts.to("cuda"))
    w = gk.asarray((RNG.standard_normal((4, 64)) * 0.1).astype(np.float32))
    q, bs, ts = gk.quantize_nvf4(w)
    qv = gk.zeros((4, 40), dtype="uint8", device="cuda")[:, 8:]  # rows 40 bytes apart: misaligned
    with pytest.raises(ValueError, match="aligned"):
        gk.gemv_nvf4(gk.zeros((1, 64), dtype="bfloat16", device="cuda"), qv, bs.to("cuda"), ts.to("cuda"))
