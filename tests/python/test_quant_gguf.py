"""GGUF Q8_0 / Q4_0 blocks: quantization bit-identical to the `gguf` package's reference
(ggml's rules), dequantization equal to the package's, and the GEMV reading the blocks
directly (CPU here; CUDA when present) against float64 products with the dequantized
weights. Bad input."""
import numpy as np
import pytest

import gpukit as gk

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import quants  # noqa: E402

RNG = np.random.default_rng(606)
CUDA = gk.cuda.is_available()


def f64(x):
    return np.asarray(gk.to_numpy(x) if isinstance(x, gk.Array) else x).astype(np.float64)


def weights(n, k):
    w = (RNG.standard_normal((n, k)) * np.linspace(0.01, 2, n)[:, None]).astype(np.float32)
    w[1, :32] = 0  # an all-zero block
    w[2, 5] = 7.0  # ties and outliers
    w[2, 9] = -7.0
    return w


@pytest.mark.parametrize("fmt,qt,bb", [("q8_0", QT.Q8_0, 34), ("q4_0", QT.Q4_0, 18)])
def test_blocks_match_gguf_package(fmt, qt, bb):
    w = weights(6, 256)
    ours = gk.to_numpy(getattr(gk, f"quantize_{fmt}")(gk.asarray(w)))
    ref = quants.quantize(w, qt)
    assert ours.dtype == np.uint8 and ours.shape == (6, 256 // 32 * bb)
    assert np.array_equal(ours, np.asarray(ref).reshape(ours.shape))
    deq = f64(getattr(gk, f"dequantize_{fmt}")(gk.asarray(ours)))
    assert np.array_equal(deq, quants.dequantize(ours, qt).astype(np.float64).reshape(deq.shape))


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no GPU"))])
@pytest.mark.parametrize("m,n,k", [(1, 7, 64), (3, 33, 1024), (8, 65, 4096), (2, 300, 14336)])
def test_gemv_blocks(fmt, dtype, device, m, n, k):
    if device == "cpu" and n * k > 1_000_000:
        pytest.skip("the CPU reference is slow at this size")
    w = weights(n, k)
    q = getattr(gk, f"quantize_{fmt}")(gk.asarray(w))
    deq = f64(getattr(gk, f"dequantize_{fmt}")(q))
    x = gk.asarray(RNG.standard_normal((m, k)).astype(np.float32)).astype(dtype)
    got = getattr(gk, f"gemv_{fmt}")(x.to(device), q.to(device), out_dtype="float32")
    ref = f64(x) @ deq.T
    bound = np.abs(f64(x)) @ np.abs(deq).T
    assert np.all(np.abs(f64(got) - ref) <= 2 * (k + 2) * 2.0**-24 * bound + 1e-30)
    if device == "cuda":
        assert gk.to_numpy(getattr(gk, f"gemv_{fmt}")(x.to(device), q.to(device), out_dtype="float32")).tobytes() \
            == gk.to_numpy(got).tobytes()


def test_gguf_bad_input():
    with pytest.raises(ValueError, match="block size 32|divisible"):
        gk.quantize_q8_0(gk.zeros((2, 48)))
    q = gk.quantize_q4_0(gk.asarray(weights(3, 64)))
    with pytest.raises(ValueError, match="multiple of 18"):
        gk.gemv_q4_0(gk.zeros(64, dtype="bfloat16"), q[:, :35])
    with pytest.raises(TypeError, match="uint8"):
        gk.gemv_q8_0(gk.zeros(64, dtype="bfloat16"), gk.zeros((3, 68), dtype="int8"))
    with pytest.raises(ValueError, match="features|K"):
        gk.gemv_q4_0(gk.zeros(32, dtype="bfloat16"), q)
