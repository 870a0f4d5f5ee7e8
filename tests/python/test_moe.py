"""Mixture-of-experts ops against float64 NumPy models written here: top-k gating (ties to the
lower expert), the stable permutation, the grouped GEMM (one launch for all experts, empty
experts, rows past the last expert), the weighted un-permute, and moe_mlp; CUDA against the
CPU (bitwise for the grouped GEMM and the permutation); bad input. CUDA parts skip without a GPU."""
import ml_dtypes
import numpy as np
import pytest

import gpukit as gk

RNG = np.random.default_rng(4242)
CUDA = gk.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU"))]
NP = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
EPS = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


def f64(a):
    return np.asarray(gk.to_numpy(a) if isinstance(a, gk.Array) else a).astype(np.float64)


def gating_ref(logits, k, renorm=True):
    lg = f64(logits)
    T, E = lg.shape
    ids = np.zeros((T, k), np.int32)
    for t in range(T):
        order = sorted(range(E), key=lambda i: (-lg[t, i], i))  # larger first, ties to the lower expert
        ids[t] = order[:k]
    p = np.exp(lg - lg.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    w = np.take_along_axis(p, ids.astype(np.int64), 1)
    if renorm:
        w = w / w.sum(1, keepdims=True)
    return ids, w


def permute_ref(ids, E):
    T, k = ids.shape
    slots = [(int(ids[t, j]), t * k + j) for t in range(T) for j in range(k)]
    order = sorted(slots)  # by expert, then by slot: stable
    pos = np.zeros(T * k, np.int32)
    for r, (_, s) in enumerate(order):
        pos[s] = r
    counts = np.bincount(ids.reshape(-1), minlength=E)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pos.reshape(T, k), offsets, np.array([s // k for _, s in order], np.int32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("T,E,k", [(1, 8, 2), (37, 8, 2), (64, 16, 4), (5, 3, 3), (300, 64, 6)])
def test_topk_gating(device, dtype, T, E, k):
    logits = RNG.standard_normal((T, E)).astype(NP[dtype])
    logits[0, :] = logits[0, 0]  # all tied: experts 0..k-1 in order
    if T > 2:
        logits[2, E - 1] = logits[2, 0] = np.max(logits[2]) + 1  # a tie for first place
    ids, w = gk.moe_topk_gating(gk.asarray(logits).to(device), k)
    rid, rw = gating_ref(logits, k)
    gi = gk.to_numpy(ids)
    assert np.array_equal(gi, rid), f"ids differ at rows {np.argwhere((gi != rid).any(1)).ravel()[:5]}"
    assert np.array_equal(gi[0], np.arange(k))
    if T > 2:
        assert gi[2, 0] == 0 and (k < 2 or gi[2, 1] == E - 1)
    np.testing.assert_allclose(f64(w), rw, rtol=2e-6, atol=1e-7)
    ids2, w2 = gk.moe_topk_gating(gk.asarray(logits).to(device), k, renormalize=False)
    np.testing.assert_allclose(f64(w2), gating_ref(logits, k, False)[1], rtol=2e-6, atol=1e-7)
    if device == "cuda":
        ci, cw = gk.moe_topk_gating(gk.asarray(logits), k)
        assert np.array_equal(gk.to_numpy(ci), gi)
        assert gk.to_numpy(gk.moe_topk_gating(gk.asarray(logits).to("cuda"), k)[1]).tobytes() == gk.to_numpy(w).tobytes()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,E,k,H", [(1, 8, 2, 16), (33, 8, 2, 40), (2000, 5, 3, 8), (7, 64, 1, 3)])
def test_permute_unpermute(device, T, E, k, H):
    x = RNG.standard_normal((T, H)).astype(ml_dtypes.bfloat16)
    ids = RNG.integers(0, E, size=(T, k)).astype(np.int32)  # repeats within a row are allowed by the ops
    ids[RNG.random((T, k)) < 0.4] = min(1, E - 1)  # a crowded expert; others may stay empty
    xs, offsets, pos, tok = gk.moe_permute(gk.asarray(x).to(device), gk.asarray(ids).to(device), E)
    rpos, roff, rtok = permute_ref(ids, E)
    assert np.array_equal(gk.to_numpy(offsets), roff)
    assert np.array_equal(gk.to_numpy(pos), rpos), "slot positions differ (the order must be stable)"
    assert np.array_equal(gk.to_numpy(tok), rtok)
    assert np.array_equal(gk.to_numpy(xs).view(np.uint16), x[rtok].view(np.uint16))
    w = RNG.random((T, k)).astype(np.float32)
    y = gk.moe_unpermute(xs, pos, gk.asarray(w).to(device), out_dtype="float32")
    ref = np.zeros((T, H))
    for j in range(k):  # fp32, in order j, product rounded then added
        ref = (ref.astype(np.float32) + (w[:, j:j + 1] * x.astype(np.float32)).astype(np.float32)).astype(np.float64)
    assert np.array_equal(f64(y), ref), f"max diff {np.max(np.abs(f64(y) - ref))}"
    yb = gk.moe_unpermute(xs, pos, gk.asarray(w).to(device))
    assert yb.dtype == gk.bfloat16
    assert np.array_equal(f64(yb), ref.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("counts,N,K", [([3, 0, 70, 1], 33, 65), ([0, 0, 5], 64, 128), ([130, 1, 64, 200], 130, 72),
                                        ([1], 7, 9)])
def test_grouped_gemm(device, dtype, counts, N, K):
    E, R = len(counts), sum(counts)
    x = RNG.standard_normal((R + 2, K)).astype(NP[dtype])  # two rows past the last expert: zeros
    w = (RNG.standard_normal((E, N, K)) / np.sqrt(K)).astype(NP[dtype])
    off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    y = gk.moe_grouped_gemm(gk.asarray(x).to(device), gk.asarray(w).to(device), gk.asarray(off).to(device),
                            out_dtype="float32")
    ref, bound = np.zeros((R + 2, N)), np.zeros((R + 2, N))
    for e in range(E):
        sl = slice(off[e], off[e + 1])
        ref[sl] = f64(x[sl]) @ f64(w[e]).T
        bound[sl] = np.abs(f64(x[sl])) @ np.abs(f64(w[e])).T
    g = f64(y)
    tol = 2 * (K + 2) * 2.0**-24 * bound
    bad = np.abs(g - ref) > tol
    assert not bad.any(), f"{bad.sum()} wrong, first at {np.argwhere(bad)[0]}, max err {np.max(np.abs(g - ref))}"
    assert not g[R:].any()
    yo = gk.moe_grouped_gemm(gk.asarray(x).to(device), gk.asarray(w).to(device), gk.asarray(off).to(device))
    assert yo.dtype == getattr(gk, dtype)
    assert np.array_equal(gk.to_numpy(yo), g.astype(np.float32).astype(NP[dtype]))  # rounded once from fp32
    if device == "cuda":
        cpu = gk.moe_grouped_gemm(gk.asarray(x), gk.asarray(w), gk.asarray(off), out_dtype="float32")
        if dtype == "float32" or K % 8:  # the CUDA-core kernel: the CPU's fma order, bit for bit
            assert gk.to_numpy(cpu).tobytes() == gk.to_numpy(y).tobytes(), "CUDA grouped GEMM != CPU reference"
        # batch invariance: one expert's rows alone (the others empty) give the same bits
        e = int(np.argmax(counts))
        solo_off = np.array([0] * (e + 1) + [counts[e]] * (E - e), np.int32)
        xe = np.ascontiguousarray(x[off[e]:off[e + 1]])
        solo = gk.moe_grouped_gemm(gk.asarray(xe).to(device), gk.asarray(w).to(device), gk.asarray(solo_off).to(device),
                                   out_dtype="float32")
        assert gk.to_numpy(solo).tobytes() == gk.to_numpy(y)[off[e]:off[e + 1]].tobytes(), "depends on other rows"


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_grouped_gemm_tensor_cores_vs_cuda_cores():
    """bf16 at a Mixtral-like shape: the tensor-core kernel within fp32 accuracy of the exact
    float64 products, run to run identical; the CUDA-core kernel (GPUKIT_MOE_NO_TENSOR_CORES=1,
    in a subprocess) equal to the CPU bit for bit."""
    import os
    import subprocess
    import sys
    counts = [300, 0, 17, 129, 64, 1, 250, 3]
    E, R, N, K = len(counts), sum(counts), 320, 256
    x = RNG.standard_normal((R, K)).astype(ml_dtypes.bfloat16)
    w = (RNG.standard_normal((E, N, K)) / 16).astype(ml_dtypes.bfloat16)
    off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    args = [gk.asarray(v).to("cuda") for v in (x, w, off)]
    y = f64(gk.moe_grouped_gemm(*args, out_dtype="float32"))
    assert gk.to_numpy(gk.moe_grouped_gemm(*args, out_dtype="float32")).tobytes() == y.astype(np.float32).tobytes()
    ref, bound = np.zeros((R, N)), np.zeros((R, N))
    for e in range(E):
        sl = slice(off[e], off[e + 1])
        ref[sl], bound[sl] = f64(x[sl]) @ f64(w[e]).T, np.abs(f64(x[sl])) @ np.abs(f64(w[e])).T
    err = np.abs(y - ref) / (bound + 1e-30)
    assert err.max() <= 2 * (K + 2) * 2.0**-24, f"max relative-to-bound error {err.max():.3g}"
    script = ("import numpy as np, ml_dtypes, gpukit as gk, sys\n"
              "d = np.load(sys.argv[1])\n"
              "x, w, off = d['x'].view(ml_dtypes.bfloat16), d['w'].view(ml_dtypes.bfloat16), d['off']\n"
              "g = gk.moe_grouped_gemm(*[gk.asarray(v).to('cuda') for v in (x, w, off)], out_dtype='float32')\n"
              "c = gk.moe_grouped_gemm(*[gk.asarray(v) for v in (x, w, off)], out_dtype='float32')\n"
              "assert gk.to_numpy(g).tobytes() == gk.to_numpy(c).tobytes(), 'CUDA-core kernel != CPU'\n"
              "print('cuda-core ok')\n")
    import tempfile
    with tempfile.TemporaryDirectory() as td:
        path = os.path.join(td, "in.npz")
        np.savez(path, x=x.view(np.uint16), w=w.view(np.uint16), off=off)
        r = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, GPUKIT_MOE_NO_TENSOR_CORES="1"))
    assert r.returncode == 0 and "cuda-core ok" in r.stdout, r.stdout + r.stderr[-3000:]


def mlp_ref(x, gate_w, w13, w2, k):
    X = f64(x)
    ids, wts = gating_ref(X @ f64(gate_w).T, k)
    I = w13.shape[1] // 2
    out = np.zeros_like(X)
    for t in range(X.shape[0]):
        for j in range(k):
            e = ids[t, j]
            g, u = f64(w13[e, :I]) @ X[t], f64(w13[e, I:]) @ X[t]
            out[t] += wts[t, j] * (f64(w2[e]) @ (g / (1 + np.exp(-g)) * u))
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_moe_mlp(device, dtype):
    T, H, I, E, k = 19, 48, 40, 8, 2
    x = RNG.standard_normal((T, H)).astype(NP[dtype])
    gate_w = (RNG.standard_normal((E, H)) / np.sqrt(H)).astype(NP[dtype])
    w13 = (RNG.standard_normal((E, 2 * I, H)) / np.sqrt(H)).astype(NP[dtype])
    w2 = (RNG.standard_normal((E, H, I)) / np.sqrt(I)).astype(NP[dtype])
    d = lambda v: gk.asarray(v).to(device)  # noqa: E731
    y = gk.moe_mlp(d(x), d(gate_w), d(w13), d(w2), k)
    assert y.shape == (T, H) and y.dtype == getattr(gk, dtype)
    ref = mlp_ref(x, gate_w, w13, w2, k)
    err = np.max(np.abs(f64(y) - ref)) / np.max(np.abs(ref))
    assert err < (1e-5 if dtype == "float32" else 3e-2), err
    again = gk.moe_mlp(d(x), d(gate_w), d(w13), d(w2), k)
    assert gk.to_numpy(again).tobytes() == gk.to_numpy(y).tobytes()
    if device == "cuda" and dtype == "float32":
        cpu = gk.moe_mlp(gk.asarray(x), gk.asarray(gate_w), gk.asarray(w13), gk.asarray(w2), k)
        np.testing.assert_allclose(f64(y), f64(cpu), rtol=1e-5, atol=1e-6)


def test_moe_bad_input():
    x = gk.ones((4, 8))
    with pytest.raises(ValueError, match="k"):
        gk.moe_topk_gating(gk.ones((4, 3)), 4)
    with pytest.raises(TypeError, match="logits"):
        gk.moe_topk_gating(gk.ones((4, 3), dtype="int32"), 1)
    with pytest.raises(IndexError, match="expert_ids"):
        gk.moe_permute(x, gk.asarray(np.array([[0], [1], [5], [2]], np.int32)), 4)
    with pytest.raises(IndexError, match="expert_ids"):
        gk.moe_permute(x, gk.asarray(np.array([[0], [1], [-1], [2]], np.int32)), 4)
    with pytest.raises(TypeError, match="expert_ids"):
        gk.moe_permute(x, gk.zeros((4, 1)), 4)
    with pytest.raises(ValueError, match="expert_ids"):
        gk.moe_permute(x, gk.zeros((3, 1), dtype="int32"), 4)
    w = gk.ones((2, 5, 8))
    with pytest.raises(ValueError, match="offsets"):
        gk.moe_grouped_gemm(x, w, gk.asarray(np.array([0, 3, 2], np.int32)))
    with pytest.raises(ValueError, match="offsets"):
        gk.moe_grouped_gemm(x, w, gk.asarray(np.array([0, 3, 9], np.int32)))
    with pytest.raises(ValueError, match="offsets"):
        gk.moe_grouped_gemm(x, w, gk.asarray(np.array([1, 3, 4], np.int32)))
    with pytest.raises(ValueError, match="offsets"):
        gk.moe_grouped_gemm(x, w, gk.asarray(np.array([0, 4], np.int32)))
    with pytest.raises(ValueError, match="offsets"):  # validate=False skips only the device's host copy
        gk.moe_grouped_gemm(x, w, gk.asarray(np.array([0, 3, 9], np.int32)), validate=False)
    with pytest.raises(TypeError, match="w"):
        gk.moe_grouped_gemm(x, gk.ones((2, 5, 8), dtype="bfloat16"), gk.asarray(np.array([0, 2, 4], np.int32)))
    with pytest.raises(ValueError, match="features"):
        gk.moe_grouped_gemm(x, gk.ones((2, 5, 7)), gk.asarray(np.array([0, 2, 4], np.int32)))
    with pytest.raises(IndexError, match="slot_pos"):
        gk.moe_unpermute(gk.ones((4, 8)), gk.asarray(np.array([[0], [4]], np.int32)), gk.ones((2, 1)))
    with pytest.raises(ValueError, match="weights"):
        gk.moe_unpermute(gk.ones((4, 8)), gk.asarray(np.array([[0], [1]], np.int32)), gk.ones((2, 2)))
    with pytest.raises(ValueError, match="w13"):
        gk.moe_mlp(x, gk.ones((3, 8)), gk.ones((3, 9, 8)), gk.ones((3, 8, 4)), 2)
