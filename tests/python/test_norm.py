"""rms_norm (plain, fused residual, Gemma) and layer_norm against float64 NumPy."""
import numpy as np
import pytest

import gpukit as gk

CUDA = gk.cuda.is_available()
DTYPES = ["float32", "float16", "bfloat16"]
TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def make(shape, dtype, seed=0, scale=1.0, device="cpu"):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale
    x = gk.asarray(a).astype(dtype)
    return x.to(device) if device != "cpu" else x


def f64(x):
    return np.asarray(gk.to_numpy(x), dtype=np.float64)


def rms_ref(x, w, eps, gemma=False):
    inv = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * inv * ((1.0 + w) if gemma else w)


def ln_ref(x, w, b, eps):
    m = x.mean(axis=-1, keepdims=True)
    v = ((x - m) ** 2).mean(axis=-1, keepdims=True)
    y = (x - m) / np.sqrt(v + eps) * w
    return y + b if b is not None else y


def close(got, ref, dtype):
    t = TOL[dtype]
    np.testing.assert_allclose(f64(got), ref, rtol=t, atol=t)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 5, 64), (4, 1000), (2, 4096), (3, 5000)])
@pytest.mark.parametrize("gemma", [False, True])
def test_rms_norm(dtype, shape, gemma):
    x = make(shape, dtype, 1)
    w = make(shape[-1:], dtype, 2)
    y = gk.nn.rms_norm(x, w, eps=1e-5, gemma=gemma)
    assert y.shape == x.shape and y.dtype == x.dtype
    close(y, rms_ref(f64(x), f64(w), 1e-5, gemma), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 3), (5, 128), (3, 2, 999)])
def test_rms_norm_residual(dtype, shape):
    x, r, w = make(shape, dtype, 1), make(shape, dtype, 3), make(shape[-1:], dtype, 2)
    y, nr = gk.nn.rms_norm(x, w, eps=1e-6, residual=r)
    # The new residual is x + r rounded once to the storage dtype.
    expect_r = gk.to_numpy(gk.asarray(f64(x) + f64(r)).astype(dtype)).astype(np.float64)
    np.testing.assert_array_equal(f64(nr), expect_r)
    close(y, rms_ref(expect_r, f64(w), 1e-6), dtype)
    # inputs untouched
    assert not nr.shares_memory(r) and not nr.shares_memory(x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (6, 33), (2, 3, 256), (2, 4100)])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm(dtype, shape, bias):
    x = make(shape, dtype, 1, scale=3.0)
    x = x + 5.0  # a large mean: a one-pass variance would lose digits
    w, b = make(shape[-1:], dtype, 2), (make(shape[-1:], dtype, 4) if bias else None)
    y = gk.nn.layer_norm(x, w, b, eps=1e-5)
    close(y, ln_ref(f64(x), f64(w), f64(b) if bias else None, 1e-5), dtype)


def test_strided_inputs():
    base = make((6, 4, 40), "float32", 5)
    x = base[:, 1:3, :]               # leading dims strided, last dense
    xs = base[:, 0, ::2]              # last dim strided: copied internally
    w = make((40,), "float32", 2)
    close(gk.nn.rms_norm(x, w), rms_ref(f64(x), f64(w), 1e-6), "float32")
    w2 = make((20,), "float32", 2)
    close(gk.nn.layer_norm(xs, w2), ln_ref(f64(xs), f64(w2), None, 1e-5), "float32")
    r = base[:, 3, :]
    y, nr = gk.nn.rms_norm(base[:, 2, :], w, residual=r)
    close(nr, f64(base[:, 2, :]) + f64(r), "float32")


def test_zero_rows_and_empty():
    x = gk.zeros((0, 16), dtype="float32")
    w = gk.ones((16,), dtype="float32")
    assert gk.nn.rms_norm(x, w).shape == (0, 16)
    y = gk.nn.rms_norm(gk.zeros((2, 16), dtype="float32"), w)  # all-zero rows: finite zeros
    assert np.all(f64(y) == 0)


def test_bad_inputs():
    x = make((2, 8), "float32")
    w = make((8,), "float32")
    with pytest.raises(TypeError, match="w: dtype"):
        gk.nn.rms_norm(x, w.astype("bfloat16"))
    with pytest.raises(ValueError, match="w: shape"):
        gk.nn.rms_norm(x, make((7,), "float32"))
    with pytest.raises(ValueError, match="residual: shape"):
        gk.nn.rms_norm(x, w, residual=make((2, 7), "float32"))
    with pytest.raises(TypeError, match="residual: dtype"):
        gk.nn.rms_norm(x, w, residual=x.astype("float16"))
    with pytest.raises(ValueError, match="eps"):
        gk.nn.rms_norm(x, w, eps=-1.0)
    with pytest.raises(TypeError, match="x: dtype"):
        gk.nn.rms_norm(x.astype("int32"), w)
    with pytest.raises(ValueError, match="b: shape"):
        gk.nn.layer_norm(x, w, make((9,), "float32"))
    with pytest.raises(ValueError, match="x: must have"):
        gk.nn.layer_norm(gk.asarray(np.float32(1.0)), w)


# ---- CUDA (run on the GPU machine) ----
gpu = pytest.mark.skipif(not CUDA, reason="no CUDA device")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H", [1, 7, 8, 64, 200, 256, 1000, 2048, 4096, 8192, 16384, 40000, 70000])
def test_cuda_matches_cpu(dtype, H):
    rows = 37
    x, r, w, b = (make((rows, H), dtype, s) for s in (1, 2, 3, 4))
    xd, rd, wd, bd = (a.to("cuda") for a in (x, r, w, b))
    t = TOL[dtype] * 2
    for gemma in (False, True):
        np.testing.assert_allclose(f64(gk.nn.rms_norm(xd, wd[0], gemma=gemma)),
                                   f64(gk.nn.rms_norm(x, w[0], gemma=gemma)), rtol=t, atol=t)
    yd, nrd = gk.nn.rms_norm(xd, wd[0], residual=rd)
    y, nr = gk.nn.rms_norm(x, w[0], residual=r)
    np.testing.assert_array_equal(f64(nrd), f64(nr))
    np.testing.assert_allclose(f64(yd), f64(y), rtol=t, atol=t)
    np.testing.assert_allclose(f64(gk.nn.layer_norm(xd, wd[0], bd[0])), f64(gk.nn.layer_norm(x, w[0], b[0])),
                               rtol=t, atol=t)


@gpu
def test_cuda_unaligned_and_strided():
    base = make((9, 3, 515), "bfloat16", 1).to("cuda")
    x = base[:, 1, 1:513]       # misaligned start: scalar path
    w = make((512,), "bfloat16", 2)
    np.testing.assert_allclose(f64(gk.nn.rms_norm(x, w.to("cuda"))), f64(gk.nn.rms_norm(x.to("cpu"), w)),
                               rtol=3e-2, atol=3e-2)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_deterministic_and_batch_independent(dtype):
    x, r = make((64, 4096), dtype, 1).to("cuda"), make((64, 4096), dtype, 2).to("cuda")
    w = make((4096,), dtype, 3).to("cuda")
    a = gk.to_numpy(gk.nn.rms_norm(x, w, residual=r)[0])
    b = gk.to_numpy(gk.nn.rms_norm(x, w, residual=r)[0])
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    one = gk.to_numpy(gk.nn.rms_norm(x[5:6], w, residual=r[5:6])[0])
    np.testing.assert_array_equal(one.view(np.uint8), a[5:6].view(np.uint8))
    l1 = gk.to_numpy(gk.nn.layer_norm(x, w))
    l2 = gk.to_numpy(gk.nn.layer_norm(x, w))
    np.testing.assert_array_equal(l1.view(np.uint8), l2.view(np.uint8))
