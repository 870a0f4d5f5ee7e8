"""rope (NeoX / interleaved, partial, scalings, in/out of place), ALiBi and
sinusoidal positions against float64 NumPy."""
import math

import numpy as np
import pytest

import gpukit as gk

CUDA = gk.cuda.is_available()
DTYPES = ["float32", "float16", "bfloat16"]
TOL = {"float32": 3e-6, "float16": 2e-3, "bfloat16": 1.6e-2}


def make(shape, dtype, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return gk.asarray(a).astype(dtype)


def f64(x):
    return np.asarray(gk.to_numpy(x), dtype=np.float64)


# ---- independent float64 inverse-frequency tables ----
def inv_freq_ref(theta, rd, sc=None):
    i = np.arange(0, rd, 2, dtype=np.float64)
    if sc is None:
        return 1.0 / theta ** (i / rd), 1.0
    t = sc["type"]
    if t == "linear":
        return 1.0 / theta ** (i / rd) / sc["factor"], 1.0
    if t == "ntk":
        b = theta * sc.get("alpha", sc["factor"]) ** (rd / (rd - 2))
        return 1.0 / b ** (i / rd), 1.0
    if t == "yarn":
        f, L = sc["factor"], sc["original_max_position"]
        bf, bs = sc.get("beta_fast", 32), sc.get("beta_slow", 1)
        base = 1.0 / theta ** (i / rd)

        def cdim(r):
            return rd * math.log(L / (r * 2 * math.pi)) / (2 * math.log(theta))
        lo, hi = max(math.floor(cdim(bf)), 0), min(math.ceil(cdim(bs)), rd - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(rd // 2) - lo) / (hi - lo), 0, 1)
        keep = 1 - ramp
        m = sc.get("mscale", 0.1 * math.log(f) + 1 if f > 1 else 1.0)
        return base / f * (1 - keep) + base * keep, m
    if t == "llama3":
        f, L, lf, hf = sc["factor"], sc["original_max_position"], sc["low_freq_factor"], sc["high_freq_factor"]
        out = []
        for v in 1.0 / theta ** (i / rd):
            wl = 2 * math.pi / v
            if wl < L / hf:
                out.append(v)
            elif wl > L / lf:
                out.append(v / f)
            else:
                s = (L / wl - lf) / (hf - lf)
                out.append((1 - s) * v / f + s * v)
        return np.array(out), 1.0
    raise ValueError(t)


def rope_ref(x, pos, theta, rd, interleaved, sc=None):
    inv, m = inv_freq_ref(theta, rd, sc)
    ang = (pos.astype(np.float32)[:, None] * inv.astype(np.float32)[None, :]).astype(np.float64)  # fp32 angle
    c, s = np.cos(ang)[:, None, :] * m, np.sin(ang)[:, None, :] * m
    y = x.copy()
    n = rd // 2
    if interleaved:
        x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]
        y[..., 0:rd:2] = x1 * c - x2 * s
        y[..., 1:rd:2] = x2 * c + x1 * s
    else:
        x1, x2 = x[..., :n], x[..., n:rd]
        y[..., :n] = x1 * c - x2 * s
        y[..., n:rd] = x2 * c + x1 * s
    return y


SCALINGS = [None, {"type": "linear", "factor": 4.0}, {"type": "ntk", "factor": 2.0, "alpha": 3.0},
            {"type": "yarn", "factor": 8.0, "original_max_position": 4096, "beta_fast": 32, "beta_slow": 1},
            {"type": "yarn", "factor": 4.0, "original_max_position": 2048, "mscale": 1.2},
            {"type": "llama3", "factor": 8.0, "original_max_position": 8192, "low_freq_factor": 1.0,
             "high_freq_factor": 4.0}]


@pytest.mark.parametrize("sc", SCALINGS)
@pytest.mark.parametrize("rd", [64, 128, 96])
def test_inv_freq_tables(sc, rd):
    f, m = gk.nn.rope_inv_freq(10000.0 if sc is None else 500000.0, rd, sc)
    rf, rm = inv_freq_ref(10000.0 if sc is None else 500000.0, rd, sc)
    np.testing.assert_allclose(f, rf, rtol=1e-13)
    assert abs(m - rm) < 1e-13


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("T,Hq,Hkv,D,rd", [(1, 1, 1, 2, None), (7, 4, 2, 64, None), (5, 3, 1, 128, 64),
                                          (9, 2, 2, 80, 48), (3, 8, 8, 256, None)])
@pytest.mark.parametrize("pos_dtype", ["int32", "int64"])
def test_rope(dtype, interleaved, T, Hq, Hkv, D, rd, pos_dtype):
    q, k = make((T, Hq, D), dtype, 1), make((T, Hkv, D), dtype, 2)
    pos = np.random.default_rng(3).integers(0, 5000, T)
    p = gk.asarray(pos.astype(pos_dtype))
    qo, ko = gk.nn.rope(q, k, p, theta=10000.0, rotary_dim=rd, interleaved=interleaved)
    r = rd or D
    t = TOL[dtype]
    np.testing.assert_allclose(f64(qo), rope_ref(f64(q), pos, 10000.0, r, interleaved), rtol=t, atol=t)
    np.testing.assert_allclose(f64(ko), rope_ref(f64(k), pos, 10000.0, r, interleaved), rtol=t, atol=t)
    if r < D:  # the tail is copied bit for bit
        np.testing.assert_array_equal(f64(qo)[..., r:], f64(q)[..., r:])


@pytest.mark.parametrize("sc", SCALINGS[1:])
def test_rope_scalings(sc):
    q = make((6, 2, 128), "float32", 1)
    pos = np.array([0, 1, 100, 5000, 30000, 131071])
    qo, ko = gk.nn.rope(q, None, gk.asarray(pos), theta=500000.0, scaling=sc)
    assert ko is None
    np.testing.assert_allclose(f64(qo), rope_ref(f64(q), pos, 500000.0, 128, False, sc), rtol=2e-6, atol=2e-6)


def test_rope_inplace_and_strided():
    qkv = make((5, 12, 64), "float32", 4)  # [T, Hq + 2 Hkv, D]: q 8 heads, k 2, v 2
    q, k, v = qkv[:, 0:8, :], qkv[:, 8:10, :], qkv[:, 10:12, :]
    before = f64(qkv)
    pos = np.array([3, 1, 4, 1, 5])
    qo, ko = gk.nn.rope(q, k, gk.asarray(pos.astype(np.int32)), inplace=True)
    assert qo.data_ptr() == q.data_ptr() and ko.data_ptr() == k.data_ptr()
    after = f64(qkv)
    np.testing.assert_allclose(after[:, 0:8], rope_ref(before[:, 0:8], pos, 1e4, 64, False), rtol=3e-6, atol=3e-6)
    np.testing.assert_allclose(after[:, 8:10], rope_ref(before[:, 8:10], pos, 1e4, 64, False), rtol=3e-6, atol=3e-6)
    np.testing.assert_array_equal(after[:, 10:12], before[:, 10:12])  # v untouched
    # out of place on a strided view leaves the input alone
    q2 = make((4, 3, 64), "bfloat16", 5)[:, ::2, :]
    b2 = f64(q2)
    out, _ = gk.nn.rope(q2, None, gk.asarray(np.arange(4)))
    np.testing.assert_array_equal(f64(q2), b2)
    np.testing.assert_allclose(f64(out), rope_ref(b2, np.arange(4), 1e4, 64, False), rtol=1.6e-2, atol=1.6e-2)


def test_rope_bad_inputs():
    q, k = make((4, 2, 64), "float32"), make((4, 1, 64), "float32")
    p = gk.asarray(np.arange(4))
    with pytest.raises(ValueError, match="positions: negative"):
        gk.nn.rope(q, k, gk.asarray(np.array([0, 1, -2, 3])))
    with pytest.raises(ValueError, match="positions: shape"):
        gk.nn.rope(q, k, gk.asarray(np.arange(5)))
    with pytest.raises(TypeError, match="positions: dtype"):
        gk.nn.rope(q, k, gk.asarray(np.arange(4.0)))
    with pytest.raises(TypeError, match="k: dtype"):
        gk.nn.rope(q, k.astype("float16"), p)
    with pytest.raises(ValueError, match="k: shape"):
        gk.nn.rope(q, make((4, 1, 32), "float32"), p)
    with pytest.raises(ValueError, match="rotary_dim"):
        gk.nn.rope(q, k, p, rotary_dim=65)
    with pytest.raises(ValueError, match="rotary_dim"):
        gk.nn.rope(q, k, p, rotary_dim=128)
    with pytest.raises(ValueError, match="theta"):
        gk.nn.rope(q, k, p, theta=-1.0)
    with pytest.raises(ValueError, match="scaling"):
        gk.nn.rope(q, k, p, scaling={"type": "magic"})
    with pytest.raises(ValueError, match="scaling: unknown key"):
        gk.nn.rope(q, k, p, scaling={"type": "linear", "factr": 2})
    with pytest.raises(ValueError, match="original_max_position"):
        gk.nn.rope(q, k, p, scaling={"type": "yarn", "factor": 2})
    with pytest.raises(ValueError, match="q: shape"):
        gk.nn.rope(make((4, 64), "float32"), None, p)
    with pytest.raises(ValueError, match="in-place"):
        gk.nn.rope(make((4, 2, 64), "float32")[:, :, ::2], None, p, inplace=True)


def test_alibi():
    for n in (1, 8, 12, 16, 40):
        s = f64(gk.nn.alibi_slopes(n))
        p = 2 ** math.floor(math.log2(n))
        want = [2 ** (-8 * (i + 1) / p) for i in range(p)]
        want += [2 ** (-4 * (2 * j + 1) / p) for j in range(n - p)]
        np.testing.assert_allclose(s, want, rtol=1e-7)
    sl = gk.nn.alibi_slopes(4)
    b = f64(gk.nn.alibi_bias(sl, 3, 5))
    i, j = np.arange(3)[:, None], np.arange(5)[None, :]
    np.testing.assert_allclose(b, f64(sl)[:, None, None] * (j - (i + 2))[None], rtol=1e-7)
    assert gk.nn.alibi_bias(sl, 2, 2, dtype="bfloat16").dtype == gk.bfloat16
    with pytest.raises(TypeError, match="slopes"):
        gk.nn.alibi_bias(sl.astype("float16"), 2, 2)
    with pytest.raises(ValueError, match="n_heads"):
        gk.nn.alibi_slopes(0)


def test_sinusoidal():
    pos = np.array([0, 1, 7, 1000, 65535])
    pe = f64(gk.nn.sinusoidal_positions(gk.asarray(pos), 64))
    inv = (1.0 / 10000 ** (np.arange(0, 64, 2) / 64)).astype(np.float32)
    ang = (pos.astype(np.float32)[:, None] * inv[None]).astype(np.float64)
    np.testing.assert_allclose(pe[:, 0::2], np.sin(ang), atol=1e-7)
    np.testing.assert_allclose(pe[:, 1::2], np.cos(ang), atol=1e-7)
    with pytest.raises(ValueError, match="dim"):
        gk.nn.sinusoidal_positions(gk.asarray(pos), 7)
    with pytest.raises(ValueError, match="negative"):
        gk.nn.sinusoidal_positions(gk.asarray(np.array([-1])), 8)


gpu = pytest.mark.skipif(not CUDA, reason="no CUDA device")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("D,rd", [(64, None), (128, None), (128, 64), (80, 48), (256, None), (6, 2)])
def test_cuda_matches_cpu(dtype, interleaved, D, rd):
    T, Hq, Hkv = 33, 8, 2
    q, k = make((T, Hq, D), dtype, 1), make((T, Hkv, D), dtype, 2)
    pos = gk.asarray(np.random.default_rng(0).integers(0, 200000, T))
    sc = {"type": "yarn", "factor": 4.0, "original_max_position": 4096}
    c = gk.nn.rope(q, k, pos, rotary_dim=rd, interleaved=interleaved, scaling=sc)
    g = gk.nn.rope(q.to("cuda"), k.to("cuda"), pos.to("cuda"), rotary_dim=rd, interleaved=interleaved, scaling=sc)
    t = TOL[dtype] * 2 + 1e-5
    for a, b in zip(c, g):
        np.testing.assert_allclose(f64(b), f64(a), rtol=t, atol=t)
    # in place on a fused qkv buffer, unaligned head offset (scalar path)
    qkv = make((T, 11, D), dtype, 3).to("cuda")
    ref = gk.nn.rope(qkv.to("cpu")[:, 1:9], qkv.to("cpu")[:, 9:11], pos, rotary_dim=rd, interleaved=interleaved)
    gk.nn.rope(qkv[:, 1:9], qkv[:, 9:11], pos.to("cuda"), rotary_dim=rd, interleaved=interleaved, inplace=True)
    np.testing.assert_allclose(f64(qkv)[:, 1:9], f64(ref[0]), rtol=t, atol=t)
    np.testing.assert_allclose(f64(qkv)[:, 9:11], f64(ref[1]), rtol=t, atol=t)


@gpu
def test_cuda_positions_alibi_sinusoidal():
    pos = gk.asarray(np.array([0, 5, 12345, 99999], np.int32))
    np.testing.assert_allclose(f64(gk.nn.sinusoidal_positions(pos.to("cuda"), 128)),
                               f64(gk.nn.sinusoidal_positions(pos, 128)), atol=2e-6)
    sl = gk.nn.alibi_slopes(12, device="cuda")
    np.testing.assert_array_equal(f64(gk.nn.alibi_bias(sl, 7, 9)), f64(gk.nn.alibi_bias(sl.to("cpu"), 7, 9)))


@gpu
def test_cuda_rope_deterministic():
    q, k = make((512, 32, 128), "bfloat16", 1).to("cuda"), make((512, 8, 128), "bfloat16", 2).to("cuda")
    pos = gk.asarray(np.arange(512)).to("cuda")
    a = gk.to_numpy(gk.nn.rope(q, k, pos)[0])
    b = gk.to_numpy(gk.nn.rope(q, k, pos)[0])
    np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))
