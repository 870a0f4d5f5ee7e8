"""Quantized GEMV with weight rows inside wider rows (a column slice of a bigger byte array): the
result must equal the contiguous weight's bit for bit, on the CPU reference and on CUDA, and the
poison bytes between the rows must never be read (0xFF bytes decode to NaN / huge scales)."""
import numpy as np
import pytest

import gpukit as gk


@pytest.fixture(autouse=True)
def staged_gguf(monkeypatch):
    """The GGUF formats here: the staged kernel, exact in x (GPUKIT_GGUF_IMMA=0: the integer kernel of that switch,
    session 17, has its own tests: test_gguf_imma_cuda.py)."""
    monkeypatch.setenv("GPUKIT_GGUF_IMMA", "0")

RNG = np.random.default_rng(2026)
N, K = 7, 512


def _weights():
    return gk.asarray((RNG.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32))


def _quantized(fmt):
    """(q, the extra arguments of gemv_<fmt>) for the format."""
    w = _weights()
    if fmt in ("fp8", "int8"):
        q, s = getattr(gk, f"quantize_{fmt}")(w)
        return q, (s,), {}
    if fmt == "int4":
        q, s, z = gk.quantize_int4(w, group=64)
        return q, (s, z), {"group": 64}
    if fmt == "nvf4":
        q, bs, ts = gk.quantize_nvf4(w)
        return q, (bs, ts), {}
    return getattr(gk, f"quantize_{fmt}")(w), (), {}


def _strided(q, pad, device):
    """q's rows copied into rows of rb + pad bytes filled with 0xFF (on device); the [:, :rb] view."""
    qn = gk.to_numpy(q)
    rb = qn.shape[1]
    wide = np.zeros((qn.shape[0], rb + pad), qn.dtype)
    wide.view(np.uint8)[:] = 0xFF
    wide[:, :rb] = qn
    view = gk.asarray(wide).to(device)[:, :rb]
    assert view.shape == tuple(qn.shape) and not view.is_contiguous(), "the test needs a strided view"
    return view


def _bits(a):
    return np.ascontiguousarray(gk.to_numpy(a)).view(np.uint32)


FORMATS = ["fp8", "int8", "int4", "nvf4", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_strided_weight_rows_same_bits(fmt, device):
    if device == "cuda" and not gk.cuda.is_available():
        pytest.skip("no CUDA device")
    q, extra, kw = _quantized(fmt)
    x = gk.asarray(RNG.standard_normal((3, K)).astype(np.float32)).astype("bfloat16")
    fn = getattr(gk, f"gemv_{fmt}")
    qs = _strided(q, 48, device)
    q, x, extra = q.to(device), x.to(device), tuple(e.to(device) for e in extra)
    want = fn(x, q, *extra, out_dtype="float32", **kw)
    got = fn(x, qs, *extra, out_dtype="float32", **kw)
    w = _bits(want)
    assert np.isfinite(gk.to_numpy(want)).all(), f"{fmt}: the contiguous result is not finite"
    g = _bits(got)
    bad = np.argwhere(g != w)
    assert bad.size == 0, (f"{fmt} on {device}: strided rows differ from contiguous at {bad[:4].tolist()} "
                           f"(got {gk.to_numpy(got).ravel()[:4]}, want {gk.to_numpy(want).ravel()[:4]})")
