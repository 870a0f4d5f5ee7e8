"""attention_decode against float64 NumPy attention: MHA/GQA/MQA, head dims,
paged and contiguous caches, per-sequence lengths, sliding window, soft-cap."""
import math

import numpy as np
import pytest

import gpukit as gk

CUDA = gk.cuda.is_available()
DTYPES = ["float32", "float16", "bfloat16"]
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def make(shape, dtype, seed=0, scale=1.0):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale
    return gk.asarray(a).astype(dtype)


def f64(x):
    return np.asarray(gk.to_numpy(x), dtype=np.float64)


def ref_decode(q, kc, vc, lens, bt=None, scale=None, window=None, softcap=None):
    """q [B, Hq, D]; caches [nb, bs, Hkv, D] (contiguous: nb == B, block = b)."""
    B, Hq, D = q.shape
    bs, Hkv = kc.shape[1], kc.shape[2]
    G = Hq // Hkv
    scale = 1 / math.sqrt(D) if scale is None else scale
    out = np.zeros_like(q)
    for b in range(B):
        L = int(lens[b])
        st = max(0, L - window) if window else 0
        pos = np.arange(st, L)
        if len(pos) == 0:
            continue
        if bt is None:
            rows_k, rows_v = kc[b, pos], vc[b, pos]
        else:
            rows_k, rows_v = kc[bt[b, pos // bs], pos % bs], vc[bt[b, pos // bs], pos % bs]
        for h in range(Hq):
            s = rows_k[:, h // G, :] @ q[b, h] * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            p = np.exp(s - s.max())
            out[b, h] = p @ rows_v[:, h // G, :] / p.sum()
    return out


def setup_paged(B, Hq, Hkv, D, bs, lens, dtype, seed=0):
    maxb = max(1, max((int(L) + bs - 1) // bs for L in lens))
    nb = B * maxb + 3
    perm = np.random.default_rng(seed).permutation(nb)[: B * maxb].reshape(B, maxb).astype(np.int32)
    kc, vc = make((nb, bs, Hkv, D), dtype, seed + 1), make((nb, bs, Hkv, D), dtype, seed + 2)
    q = make((B, Hq, D), dtype, seed + 3)
    return q, kc, vc, perm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Hq,Hkv", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_paged(dtype, Hq, Hkv, D):
    lens = np.array([1, 37, 0, 300], np.int32)
    q, kc, vc, bt = setup_paged(4, Hq, Hkv, D, 16, lens, dtype)
    out = gk.nn.attention_decode(q, kc, vc, lens, block_table=bt)
    assert out.shape == (4, Hq, D) and out.dtype == q.dtype
    want = ref_decode(f64(q), f64(kc), f64(vc), lens, bt)
    t = TOL[dtype]
    np.testing.assert_allclose(f64(out), want, rtol=t, atol=t)
    assert np.all(f64(out)[2] == 0)  # empty sequence


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_contiguous_window_softcap_scale(dtype):
    B, Hq, Hkv, D, Tm = 3, 8, 2, 64, 50
    q, kc, vc = make((B, Hq, D), dtype, 1), make((B, Tm, Hkv, D), dtype, 2), make((B, Tm, Hkv, D), dtype, 3)
    lens = np.array([50, 7, 33], np.int32)
    t = TOL[dtype]
    for kw in [{}, {"window": 10}, {"softcap": 5.0}, {"scale": 0.3, "window": 1}, {"window": 100, "softcap": 1.0}]:
        out = gk.nn.attention_decode(q, kc, vc, lens, **kw)
        np.testing.assert_allclose(f64(out), ref_decode(f64(q), f64(kc), f64(vc), lens, **kw), rtol=t, atol=t)


def test_strided_q_and_large_logits():
    B, Hq, Hkv, D = 2, 4, 2, 64
    qq = make((B, 2 * Hq, D), "float32", 1, scale=30.0)
    q = qq[:, ::2, :]
    lens = np.array([20, 5], np.int32)
    _, kc, vc, bt = setup_paged(B, Hq, Hkv, D, 16, lens, "float32")
    out = gk.nn.attention_decode(q, kc, vc, lens, block_table=bt)
    np.testing.assert_allclose(f64(out), ref_decode(f64(q), f64(kc), f64(vc), lens, bt), rtol=1e-5, atol=1e-5)
    assert np.all(np.isfinite(f64(out)))


def test_bad_inputs():
    lens = np.array([3, 4], np.int32)
    q, kc, vc, bt = setup_paged(2, 6, 4, 64, 16, lens, "float32")
    with pytest.raises(ValueError, match="not a multiple"):
        gk.nn.attention_decode(q, kc, vc, lens, block_table=bt)
    q, kc, vc, bt = setup_paged(2, 4, 2, 64, 16, lens, "float32")
    with pytest.raises(ValueError, match="head_dim 32"):
        gk.nn.attention_decode(make((2, 4, 32), "float32"), make((8, 16, 2, 32), "float32"),
                               make((8, 16, 2, 32), "float32"), lens, block_table=bt)
    with pytest.raises(ValueError, match="longer than the cache"):
        gk.nn.attention_decode(q, kc, vc, np.array([3, 17], np.int32), block_table=bt)
    with pytest.raises(ValueError, match="negative"):
        gk.nn.attention_decode(q, kc, vc, np.array([-1, 1], np.int32), block_table=bt)
    bad = bt.copy()
    bad[1, 0] = kc.shape[0]
    with pytest.raises(IndexError, match="outside the pool"):
        gk.nn.attention_decode(q, kc, vc, lens, block_table=bad)
    with pytest.raises(TypeError, match="k_cache: dtype"):
        gk.nn.attention_decode(q, kc.astype("bfloat16"), vc, lens, block_table=bt)
    with pytest.raises(ValueError, match="seq_lens: must be int32"):
        gk.nn.attention_decode(q, kc, vc, lens.astype(np.int64), block_table=bt)
    with pytest.raises(ValueError, match="contiguous cache"):
        gk.nn.attention_decode(q, kc, vc, lens)
    with pytest.raises(ValueError, match="window"):
        gk.nn.attention_decode(q, kc, vc, lens, block_table=bt, window=0)
    with pytest.raises(ValueError, match="softcap"):
        gk.nn.attention_decode(q, kc, vc, lens, block_table=bt, softcap=-1.0)
    with pytest.raises(ValueError, match="block_size"):
        c = make((4, 8, 2, 64), "float32")
        gk.nn.attention_decode(q, c, c, lens, block_table=np.zeros((2, 1), np.int32))


gpu = pytest.mark.skipif(not CUDA, reason="no CUDA device")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Hq,Hkv", [(8, 8), (32, 8), (32, 1), (40, 8)])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_cuda_paged_vs_float64(dtype, Hq, Hkv, D):
    lens = np.array([1, 255, 256, 257, 1000, 0], np.int32)  # around the 256-token split
    bs = 32
    q, kc, vc, bt = setup_paged(len(lens), Hq, Hkv, D, bs, lens, dtype)
    out = gk.nn.attention_decode(q.to("cuda"), kc.to("cuda"), vc.to("cuda"), gk.asarray(lens).to("cuda"),
                                 block_table=gk.asarray(bt).to("cuda"))
    t = TOL[dtype] * 2
    np.testing.assert_allclose(f64(out), ref_decode(f64(q), f64(kc), f64(vc), lens, bt), rtol=t, atol=t)


@gpu
@pytest.mark.parametrize("kw", [{}, {"window": 300}, {"window": 5, "softcap": 30.0}, {"softcap": 2.0}])
def test_cuda_contiguous_long(kw):
    B, Hq, Hkv, D, Tm = 2, 16, 4, 128, 3000
    q, kc, vc = (make(s, "bfloat16", i) for i, s in enumerate([(B, Hq, D), (B, Tm, Hkv, D), (B, Tm, Hkv, D)]))
    lens = np.array([3000, 1234], np.int32)
    out = gk.nn.attention_decode(q.to("cuda"), kc.to("cuda"), vc.to("cuda"), lens, **kw)
    np.testing.assert_allclose(f64(out), ref_decode(f64(q), f64(kc), f64(vc), lens, **kw), rtol=2e-2, atol=2e-2)


@gpu
def test_cuda_deterministic_and_batch_independent():
    B, Hq, Hkv, D, bs = 8, 32, 8, 128, 64
    lens = np.array([5000, 17, 4096, 300, 1, 2222, 777, 4097], np.int32)
    q, kc, vc, bt = setup_paged(B, Hq, Hkv, D, bs, lens, "bfloat16")
    qd, kd, vd = q.to("cuda"), kc.to("cuda"), vc.to("cuda")
    run = lambda qq, l, t: gk.to_numpy(gk.nn.attention_decode(qq, kd, vd, gk.asarray(l).to("cuda"),
                                                              block_table=gk.asarray(t).to("cuda"))).view(np.uint16)
    a, b = run(qd, lens, bt), run(qd, lens, bt)
    np.testing.assert_array_equal(a, b)
    # sequence 2 alone, and with different neighbours (other lengths), gives the same bits
    alone = run(qd[2:3], lens[2:3], bt[2:3])
    np.testing.assert_array_equal(alone[0], a[2])
    l2 = lens.copy()
    l2[[0, 1, 3]] = [1, 4999, 64]
    np.testing.assert_array_equal(run(qd, l2, bt)[2], a[2])


@gpu
def test_cuda_device_metadata_validate():
    lens = np.array([3, 4], np.int32)
    q, kc, vc, bt = setup_paged(2, 4, 2, 64, 16, lens, "float32")
    args = [x.to("cuda") for x in (q, kc, vc)]
    bad = bt.copy()
    bad[0, 0] = 10 ** 6
    with pytest.raises(IndexError):
        gk.nn.attention_decode(*args, gk.asarray(lens).to("cuda"), block_table=gk.asarray(bad).to("cuda"),
                               validate=True)
    out = gk.nn.attention_decode(*args, gk.asarray(lens).to("cuda"), block_table=gk.asarray(bad).to("cuda"))
    assert np.all(np.isfinite(f64(out))) and not gk.cuda.is_failed()


# ---- prefill ----
def ref_prefill(q, k, v, cuq, cuk, causal=True, scale=None, window=None, softcap=None):
    Tq, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    scale = 1 / math.sqrt(D) if scale is None else scale
    out = np.zeros_like(q)
    for b in range(len(cuq) - 1):
        q0, Lq, k0, Lk = cuq[b], cuq[b + 1] - cuq[b], cuk[b], cuk[b + 1] - cuk[b]
        for i in range(Lq):
            p = i + Lk - Lq
            hi = min(p + 1, Lk) if causal else Lk
            lo = max(0, p - window + 1) if window else 0
            if hi <= lo:
                continue
            for h in range(Hq):
                s = k[k0 + lo:k0 + hi, h // G] @ q[q0 + i, h] * scale
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                w = np.exp(s - s.max())
                out[q0 + i, h] = w @ v[k0 + lo:k0 + hi, h // G] / w.sum()
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Hq,Hkv,D", [(4, 4, 64), (8, 2, 128), (4, 1, 256)])
@pytest.mark.parametrize("causal", [True, False])
def test_prefill_varlen(dtype, Hq, Hkv, D, causal):
    cuq = np.array([0, 5, 5, 12, 13], np.int32)
    cuk = np.array([0, 5, 9, 20, 21], np.int32)  # seq 2: 11 keys for 7 queries (cached prefix)
    q, k, v = make((13, Hq, D), dtype, 1), make((21, Hkv, D), dtype, 2), make((21, Hkv, D), dtype, 3)
    out = gk.nn.attention_prefill(q, k, v, cuq, cuk, causal=causal)
    t = TOL[dtype]
    np.testing.assert_allclose(f64(out), ref_prefill(f64(q), f64(k), f64(v), cuq, cuk, causal), rtol=t, atol=t)


def test_prefill_single_window_softcap():
    q, k, v = make((9, 4, 64), "float32", 1), make((9, 2, 64), "float32", 2), make((9, 2, 64), "float32", 3)
    one = np.array([0, 9], np.int32)
    for kw in [{}, {"window": 3}, {"softcap": 2.0, "scale": 0.5}]:
        out = gk.nn.attention_prefill(q, k, v, **kw)
        np.testing.assert_allclose(f64(out), ref_prefill(f64(q), f64(k), f64(v), one, one, **kw), rtol=1e-5,
                                   atol=1e-5)
    with pytest.raises(ValueError, match="not a multiple"):
        gk.nn.attention_prefill(make((9, 3, 64), "float32"), k, v)
    with pytest.raises(ValueError, match="head_dim"):
        gk.nn.attention_prefill(make((9, 4, 32), "float32"), make((9, 2, 32), "float32"), make((9, 2, 32), "float32"))
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        gk.nn.attention_prefill(q, k, v, np.array([0, 8], np.int32), one)
    with pytest.raises(ValueError, match="both or neither"):
        gk.nn.attention_prefill(q, k, v, one)
    with pytest.raises(TypeError, match="v: dtype"):
        gk.nn.attention_prefill(q, k, v.astype("float16"))
    with pytest.raises(ValueError, match="window"):
        gk.nn.attention_prefill(q, k, v, causal=False, window=2)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Hq,Hkv,D", [(8, 8, 64), (32, 8, 128), (8, 1, 256)])
def test_cuda_prefill(dtype, Hq, Hkv, D):
    cuq = np.array([0, 300, 301, 700], np.int32)
    cuk = np.array([0, 300, 600, 1000], np.int32)
    q, k, v = make((700, Hq, D), dtype, 1), make((1000, Hkv, D), dtype, 2), make((1000, Hkv, D), dtype, 3)
    out = gk.nn.attention_prefill(q.to("cuda"), k.to("cuda"), v.to("cuda"), gk.asarray(cuq).to("cuda"),
                                  gk.asarray(cuk).to("cuda"))
    t = TOL[dtype] * 2
    np.testing.assert_allclose(f64(out), ref_prefill(f64(q), f64(k), f64(v), cuq, cuk), rtol=t, atol=t)
    again = gk.nn.attention_prefill(q.to("cuda"), k.to("cuda"), v.to("cuda"), cuq, cuk)
    np.testing.assert_array_equal(gk.to_numpy(out).view(np.uint8), gk.to_numpy(again).view(np.uint8))


def _fp8_setup(device="cpu"):
    B, Hq, Hkv, D, bs = 3, 8, 2, 64, 16
    lens = np.array([20, 1, 40], np.int32)
    bt = np.arange(B * 3, dtype=np.int32).reshape(B, 3)
    T = int(lens.sum())
    k, v = make((T, Hkv, D), "bfloat16", 1, scale=3.0), make((T, Hkv, D), "bfloat16", 2, scale=3.0)
    kc = gk.zeros((B * 3, bs, Hkv, D), dtype="float8_e4m3fn").to(device)
    vc = gk.zeros((B * 3, bs, Hkv, D), dtype="float8_e4m3fn").to(device)
    ks, vs = gk.asarray(np.array([0.05, 0.1], np.float32)), gk.asarray(np.array([0.02, 0.5], np.float32))
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    gk.nn.kv_append(k.to(device), v.to(device), kc, vc, block_table=bt, seq_lens=np.zeros(B, np.int32),
                    cu_seqlens=cu, k_scale=ks.to(device), v_scale=vs.to(device))
    q = make((B, Hq, D), "bfloat16", 3)
    return q, kc, vc, lens, bt, ks, vs


def test_fp8_cache_decode():
    q, kc, vc, lens, bt, ks, vs = _fp8_setup()
    out = gk.nn.attention_decode(q, kc, vc, lens, block_table=bt, k_scale=ks, v_scale=vs)
    kd = gk.to_numpy(kc).astype(np.float64) * f64(ks)[None, None, :, None]
    vd = gk.to_numpy(vc).astype(np.float64) * f64(vs)[None, None, :, None]
    np.testing.assert_allclose(f64(out), ref_decode(f64(q), kd, vd, lens, bt), rtol=1.6e-2, atol=1.6e-2)
    with pytest.raises(ValueError, match="k_scale"):
        gk.nn.attention_decode(q, kc, vc, lens, block_table=bt)
    with pytest.raises(TypeError, match="v_cache: dtype"):
        gk.nn.attention_decode(q, kc, vc.astype("bfloat16"), lens, block_table=bt, k_scale=ks, v_scale=vs)


@gpu
def test_cuda_fp8_cache_decode():
    q, kc, vc, lens, bt, ks, vs = _fp8_setup("cuda")
    got = gk.nn.attention_decode(q.to("cuda"), kc, vc, lens, block_table=bt, k_scale=ks.to("cuda"),
                                 v_scale=vs.to("cuda"))
    want = gk.nn.attention_decode(q, kc.to("cpu"), vc.to("cpu"), lens, block_table=bt, k_scale=ks, v_scale=vs)
    np.testing.assert_allclose(f64(got), f64(want), rtol=2e-2, atol=2e-2)
