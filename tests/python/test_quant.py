"""Weight quantization (fp8-e4m3 / int8 per channel, int4 with group scales and zero
points): the rounding rules against an independent NumPy implementation, exact
dequantization, and the quantized GEMV on the CPU against float64 products with the
dequantized weights; bad input. CUDA kernels: test_quant_cuda.py."""
import math

import ml_dtypes
import numpy as np
import pytest

import gpukit as gk

RNG = np.random.default_rng(404)


def f64(x):
    return np.asarray(gk.to_numpy(x) if isinstance(x, gk.Array) else x).astype(np.float64)


def np_int8(w):
    s = np.abs(w).max(axis=1) / np.float32(127)
    s = np.where(s > 0, s, 1).astype(np.float32)
    q = np.clip(np.rint(w / s[:, None]), -127, 127).astype(np.int8)
    return q, s


def np_fp8(w):
    s = (np.abs(w).max(axis=1) / np.float32(448)).astype(np.float32)
    s = np.where(s > 0, s, 1).astype(np.float32)
    q = (w / s[:, None]).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    return q, s


def np_int4(w, g):
    n, k = w.shape
    wg = w.reshape(n, k // g, g)
    lo = np.minimum(wg.min(axis=2), 0).astype(np.float32)
    hi = np.maximum(wg.max(axis=2), 0).astype(np.float32)
    s = ((hi - lo) / np.float32(15)).astype(np.float32)
    s = np.where(s > 0, s, 1).astype(np.float32)
    z = np.clip(np.rint(-lo / s), 0, 15).astype(np.float32)
    q = np.clip(np.rint(wg / s[:, :, None]) + z[:, :, None], 0, 15).astype(np.uint8).reshape(n, k)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return packed, s, z.astype(np.uint8), q


def deq_int4(q4, s, z, g):
    n, k = q4.shape
    return ((q4.reshape(n, k // g, g).astype(np.float64) - z[:, :, None]) * s[:, :, None]).reshape(n, k)


W = RNG.standard_normal((13, 256)).astype(np.float32) * np.linspace(0.1, 3, 13, dtype=np.float32)[:, None]
W[3] = 0  # a zero row


def test_quantize_int8_rule():
    q, s = gk.quantize_int8(gk.asarray(W))
    qr, sr = np_int8(W)
    assert q.dtype == gk.int8 and s.dtype == gk.float32
    assert np.array_equal(gk.to_numpy(s), sr) and np.array_equal(gk.to_numpy(q), qr)
    d = f64(gk.dequantize_int8(q, s))
    assert np.array_equal(d, (qr.astype(np.float32) * sr[:, None]).astype(np.float64))
    assert np.all(np.abs(d - W) <= sr[:, None] * 0.5000001)


def test_quantize_fp8_rule():
    q, s = gk.quantize_fp8(gk.asarray(W))
    qr, sr = np_fp8(W)
    assert q.dtype == gk.float8_e4m3fn
    assert np.array_equal(gk.to_numpy(s), sr)
    assert np.array_equal(gk.to_numpy(q).view(np.uint8), qr.view(np.uint8))
    d = f64(gk.dequantize_fp8(q, s))
    assert np.array_equal(d, (qr.astype(np.float32) * sr[:, None]).astype(np.float64))
    rel = np.abs(d - W) / np.maximum(np.abs(W), 1e-30)
    assert np.all((rel <= 2.0**-4) | (np.abs(W) < sr[:, None] * 2.0**-6))


@pytest.mark.parametrize("g", [32, 64, 128])
def test_quantize_int4_rule(g):
    q, s, z = gk.quantize_int4(gk.asarray(W), group=g)
    packed, sr, zr, q4 = np_int4(W, g)
    assert q.dtype == gk.uint8 and q.shape == (13, 128) and s.shape == (13, 256 // g) and z.shape == s.shape
    assert np.array_equal(gk.to_numpy(s), sr) and np.array_equal(gk.to_numpy(z), zr)
    assert np.array_equal(gk.to_numpy(q), packed)
    d = f64(gk.dequantize_int4(q, s, z, group=g))
    assert np.allclose(d, deq_int4(q4, sr, zr, g), rtol=0, atol=1e-6)
    step = np.repeat(sr, g, axis=1)
    assert np.all(np.abs(d - W) <= step * 0.5000001 + 1e-7)


def test_quantize_from_bf16_and_deterministic():
    wb = gk.asarray(W).astype("bfloat16")
    a = gk.quantize_int4(wb, group=64)
    b = gk.quantize_int4(wb, group=64)
    for x, y in zip(a, b):
        assert np.array_equal(gk.to_numpy(x), gk.to_numpy(y))


def gemv_ref(x, wdeq):
    return f64(x) @ wdeq.T, np.abs(f64(x)) @ np.abs(wdeq).T


def check(got, x, wdeq, out_eps):
    ref, bound = gemv_ref(x, wdeq)
    g = f64(got)
    assert g.shape == ref.shape
    k = wdeq.shape[1]
    tol = 2 * out_eps * np.abs(ref) + 2 * (k + 2) * 2.0**-24 * bound + 1e-30
    bad = ~(np.abs(g - ref) <= tol)
    assert not bad.any(), f"{bad.sum()} of {bad.size} out of tolerance"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_gemv_quantized_cpu(dtype, m):
    eps = {"bfloat16": 2.0**-8, "float16": 2.0**-11}[dtype]
    x = gk.asarray(RNG.standard_normal((m, 256)).astype(np.float32)).astype(dtype)
    q, s = gk.quantize_fp8(gk.asarray(W))
    check(gk.gemv_fp8(x, q, s), x, f64(gk.dequantize_fp8(q, s)), eps)
    q, s = gk.quantize_int8(gk.asarray(W))
    check(gk.gemv_int8(x, q, s), x, f64(gk.dequantize_int8(q, s)), eps)
    for g in (32, 128):
        q, s, z = gk.quantize_int4(gk.asarray(W), group=g)
        y = gk.gemv_int4(x, q, s, z, group=g, out_dtype="float32")
        assert y.dtype == gk.float32
        check(y, x, f64(gk.dequantize_int4(q, s, z, group=g)), 2.0**-24)


def test_gemv_quantized_1d_and_many_rows():
    q, s = gk.quantize_int8(gk.asarray(W))
    x = gk.asarray(RNG.standard_normal(256).astype(np.float32))  # float32 x -> bf16, float32 result
    y = gk.gemv_int8(x, q, s)
    assert y.shape == (13,) and y.dtype == gk.float32
    check(y, x.astype("bfloat16"), f64(gk.dequantize_int8(q, s)), 2.0**-24)
    x12 = gk.asarray(RNG.standard_normal((12, 256)).astype(np.float32)).astype("bfloat16")
    check(gk.gemv_int8(x12, q, s, out_dtype="float32"), x12, f64(gk.dequantize_int8(q, s)), 2.0**-8)


def test_quant_bad_input():
    w = gk.asarray(W)
    with pytest.raises(ValueError, match="group"):
        gk.quantize_int4(w, group=48)
    with pytest.raises(ValueError, match="divisible"):
        gk.quantize_int4(gk.zeros((2, 96)), group=64)
    with pytest.raises(TypeError, match="w"):
        gk.quantize_int8(gk.zeros((2, 4), dtype="int32"))
    with pytest.raises(ValueError, match="w"):
        gk.quantize_fp8(gk.zeros(4))
    q, s = gk.quantize_int8(w)
    x = gk.zeros((1, 256), dtype="bfloat16")
    with pytest.raises(ValueError, match="scales"):
        gk.gemv_int8(x, q, None)
    with pytest.raises(ValueError, match="scales"):
        gk.gemv_int8(x, q, s[:5])
    with pytest.raises(TypeError, match="q"):
        gk.gemv_fp8(x, q, s)          # int8 data passed as fp8
    with pytest.raises(TypeError, match="scales"):
        gk.gemv_int8(x, q, s.astype("float16"))
    with pytest.raises(ValueError, match="features|K"):
        gk.gemv_int8(gk.zeros((1, 255), dtype="bfloat16"), q, s)
    q4, s4, z4 = gk.quantize_int4(w, group=64)
    with pytest.raises(ValueError, match="zeros"):
        gk.gemv_int4(x, q4, s4, None, group=64)
    with pytest.raises(ValueError, match="scales|group|divisible"):
        gk.gemv_int4(x, q4, s4, z4, group=128)   # group does not match the scales' shape
    with pytest.raises(ValueError, match="group"):
        gk.dequantize_int4(q4, s4, z4, group=16)
    with pytest.raises(TypeError, match="x"):
        gk.gemv_int8(gk.zeros((1, 256), dtype="int8"), q, s)
