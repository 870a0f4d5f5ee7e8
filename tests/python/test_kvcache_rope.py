"""kv_append fused with RoPE on k: against float64 NumPy (the rotation of test_rope.rope_ref
stored through test_kvcache.paged_ref), bit for bit against the unfused CPU path (rope, then
kv_append), NeoX / interleaved, partial rotary dims, scalings, explicit and cache positions,
paged / contiguous / slot-mapped caches, fp8 caches, write_k, and bad input."""
import numpy as np
import pytest

import gpukit as gk
from test_kvcache import paged_ref
from test_rope import rope_ref

CUDA = gk.cuda.is_available()
DTYPES = ["float32", "float16", "bfloat16"]
TOL = {"float32": 3e-6, "float16": 2e-3, "bfloat16": 1.6e-2}
gpu = pytest.mark.skipif(not CUDA, reason="no CUDA device")

SCALINGS = [None, {"type": "linear", "factor": 4.0}, {"type": "ntk", "factor": 2.0},
            {"type": "yarn", "factor": 8.0, "original_max_position": 64},
            {"type": "llama3", "factor": 8.0, "original_max_position": 64, "low_freq_factor": 1.0,
             "high_freq_factor": 4.0}]


def make(shape, dtype, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return gk.asarray(a).astype(dtype)


def np_of(x):
    return gk.to_numpy(x).copy()


def f64(x):
    return np.asarray(gk.to_numpy(x), dtype=np.float64)


def paged_case(H=3, D=32, bs=16):
    """4 sequences appending 3, 2, 1, 0 tokens at lengths 0, 15, 19, 2 (page boundaries crossed)."""
    lens = np.array([0, 15, 19, 2], np.int32)
    n_new = np.array([3, 2, 1, 0])
    cu = np.concatenate([[0], np.cumsum(n_new)]).astype(np.int32)
    bt = np.array([[4, 0, 1], [2, 3, 0], [7, 8, 1], [5, 6, 6]], np.int32)
    pos = np.concatenate([np.arange(lens[b], lens[b] + n_new[b]) for b in range(4)]).astype(np.int64)
    return dict(H=H, D=D, nb=9, bs=bs, lens=lens, cu=cu, bt=bt, T=int(cu[-1]), cache_pos=pos)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rd", [None, 16, 6])
@pytest.mark.parametrize("sc", [0, 1, 3, 4])
def test_paged_rope_vs_float64_and_unfused(dtype, interleaved, rd, sc):
    c = paged_case()
    H, D, T = c["H"], c["D"], c["T"]
    scaling = SCALINGS[sc]
    k, v = make((T, H, D), dtype, 1), make((T, H, D), dtype, 2)
    kc, vc = gk.full((c["nb"], c["bs"], H, D), 7.0, dtype=dtype), gk.full((c["nb"], c["bs"], H, D), 7.0, dtype=dtype)
    kc0, vc0 = np_of(kc), np_of(vc)
    gk.nn.kv_append(k, v, kc, vc, block_table=c["bt"], seq_lens=c["lens"], cu_seqlens=c["cu"], rope=True,
                    theta=500.0, rotary_dim=rd, interleaved=interleaved, scaling=scaling)
    # float64: rotate at the cache positions, store through the paged reference
    kr = rope_ref(f64(k), c["cache_pos"], 500.0, rd or D, interleaved, scaling)
    want_k = paged_ref(kc0.astype(np.float64), kr, c["bt"], c["lens"], c["cu"])
    t = TOL[dtype]
    np.testing.assert_allclose(f64(kc), want_k, rtol=t, atol=t)
    np.testing.assert_array_equal(np_of(vc), paged_ref(vc0, np_of(v), c["bt"], c["lens"], c["cu"]))
    # unfused CPU path: rope(k) then kv_append, same bits
    kc2 = gk.full((c["nb"], c["bs"], H, D), 7.0, dtype=dtype)
    _, k2 = gk.nn.rope(make((T, 1, D), dtype), k, c["cache_pos"], theta=500.0, rotary_dim=rd,
                       interleaved=interleaved, scaling=scaling)
    gk.nn.kv_append(k2, v, kc2, gk.full((c["nb"], c["bs"], H, D), 7.0, dtype=dtype), block_table=c["bt"],
                    seq_lens=c["lens"], cu_seqlens=c["cu"])
    np.testing.assert_array_equal(np_of(kc).view(np.uint8), np_of(kc2).view(np.uint8))


@pytest.mark.parametrize("pos_dtype", [np.int32, np.int64])
def test_slot_mapping_explicit_positions_and_write_k(pos_dtype):
    T, H, D, nb, bs = 5, 2, 64, 2, 16
    k, v = make((T, H, D), "bfloat16", 1), make((T, H, D), "bfloat16", 2)
    k_orig = np_of(k)
    kc, vc = gk.zeros((nb, bs, H, D), dtype="bfloat16"), gk.zeros((nb, bs, H, D), dtype="bfloat16")
    slots = np.array([3, -1, 17, 31, 0])
    pos = np.array([100, 7, 0, 4096, 65535], pos_dtype)
    gk.nn.kv_append(k, v, kc, vc, slot_mapping=slots, rope=True, positions=pos, write_k=True)
    kr = rope_ref(k_orig.astype(np.float64), pos.astype(np.int64), 10000.0, D, False)
    np.testing.assert_allclose(f64(k), kr, rtol=1.6e-2, atol=1.6e-2)  # k_new overwritten, skipped token too
    got = np_of(kc).reshape(nb * bs, H, D)
    for t, s in enumerate(slots):
        if s >= 0:
            np.testing.assert_array_equal(got[s], np_of(k)[t])  # the cache holds the same rotated bits
    assert np.count_nonzero(got.reshape(nb * bs, -1).any(axis=1)) == 4


def test_contiguous_cache_rope_at_cache_positions():
    B, Tm, H, D = 3, 10, 2, 16
    k, v = make((B, H, D), "float32", 1), make((B, H, D), "float32", 2)
    kc, vc = gk.zeros((B, Tm, H, D), dtype="float32"), gk.zeros((B, Tm, H, D), dtype="float32")
    lens = np.array([0, 9, 4], np.int32)
    gk.nn.kv_append(k, v, kc, vc, seq_lens=lens, rope=True, interleaved=True, rotary_dim=8)
    kr = rope_ref(f64(k), lens.astype(np.int64), 10000.0, 8, True)
    got = f64(kc)
    for b in range(B):
        np.testing.assert_allclose(got[b, lens[b]], kr[b], rtol=3e-6, atol=3e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_cache_rope(dtype):
    import ml_dtypes
    c = paged_case(H=2, D=64)
    T, H, D = c["T"], c["H"], c["D"]
    k, v = make((T, H, D), dtype, 1), make((T, H, D), dtype, 2)
    ks, vs = np.array([0.25, 2.0], np.float32), np.array([0.5, 0.125], np.float32)
    kc = gk.zeros((c["nb"], c["bs"], H, D), dtype="float8_e4m3fn")
    vc = gk.zeros((c["nb"], c["bs"], H, D), dtype="float8_e4m3fn")
    gk.nn.kv_append(k, v, kc, vc, block_table=c["bt"], seq_lens=c["lens"], cu_seqlens=c["cu"], k_scale=ks,
                    v_scale=vs, rope=True)
    # rotated k rounded to the storage dtype first, then quantized (what rope + kv_append gives)
    _, k2 = gk.nn.rope(make((T, 1, D), dtype), k, c["cache_pos"])
    kq = (np_of(k2).astype(np.float32) / ks[None, :, None]).astype(ml_dtypes.float8_e4m3fn)
    want = paged_ref(np.zeros((c["nb"], c["bs"], H, D), ml_dtypes.float8_e4m3fn), kq, c["bt"], c["lens"], c["cu"])
    np.testing.assert_array_equal(np_of(kc).view(np.uint8), want.view(np.uint8))


def test_bad_inputs():
    c = paged_case(H=2, D=16)
    T, H, D = c["T"], c["H"], c["D"]
    k, v = make((T, H, D), "float32", 1), make((T, H, D), "float32", 2)
    kc, vc = gk.zeros((c["nb"], c["bs"], H, D), dtype="float32"), gk.zeros((c["nb"], c["bs"], H, D), dtype="float32")
    idx = dict(block_table=c["bt"], seq_lens=c["lens"], cu_seqlens=c["cu"])
    with pytest.raises(ValueError, match="positions: negative"):
        gk.nn.kv_append(k, v, kc, vc, **idx, rope=True, positions=np.array([0, 1, 2, -1, 4, 5]))
    with pytest.raises(ValueError, match="positions: shape"):
        gk.nn.kv_append(k, v, kc, vc, **idx, rope=True, positions=np.arange(5))
    with pytest.raises(TypeError, match="positions: dtype"):
        gk.nn.kv_append(k, v, kc, vc, **idx, rope=True, positions=np.arange(6, dtype=np.float32))
    for rd in (3, 18, 0):
        with pytest.raises(ValueError, match="rotary_dim"):
            gk.nn.kv_append(k, v, kc, vc, **idx, rope=True, rotary_dim=rd)
    with pytest.raises(ValueError, match="theta"):
        gk.nn.kv_append(k, v, kc, vc, **idx, rope=True, theta=-1.0)
    with pytest.raises(ValueError, match="positions: required"):
        gk.nn.kv_append(k, v, kc, vc, slot_mapping=np.arange(T), rope=True)
    with pytest.raises(ValueError, match="only with rope=True"):
        gk.nn.kv_append(k, v, kc, vc, **idx, interleaved=True)
    with pytest.raises(ValueError, match="write_k"):
        kk = make((T, H, 2 * D), "float32")[:, :, ::2]
        gk.nn.kv_append(kk, v, kc, vc, **idx, rope=True, write_k=True)
    assert not np.any(np_of(kc)) and not np.any(np_of(vc))  # nothing was written


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rd,sc", [(None, 0), (16, 3), (6, 4)])
@pytest.mark.parametrize("fp8", [False, True])
def test_cuda_matches_cpu_and_unfused(dtype, interleaved, rd, sc, fp8):
    c = paged_case(H=4, D=32 if rd != 6 else 64, bs=32)
    T, H, D = c["T"], c["H"], c["D"]
    k, v = make((T, H, D), dtype, 1), make((T, H, D), dtype, 2)
    cdt = "float8_e4m3fn" if fp8 else dtype
    sc_kw = dict(k_scale=np.full(H, 0.5, np.float32), v_scale=np.linspace(0.1, 2, H).astype(np.float32)) if fp8 else {}
    rope_kw = dict(theta=1e4, rotary_dim=rd, interleaved=interleaved, scaling=SCALINGS[sc])
    res = {}
    for dev in ("cpu", "cuda"):
        kc = gk.zeros((c["nb"], c["bs"], H, D), dtype=cdt).to(dev)
        vc = gk.zeros((c["nb"], c["bs"], H, D), dtype=cdt).to(dev)
        kk = k.to(dev).copy()
        gk.nn.kv_append(kk, v.to(dev), kc, vc, block_table=c["bt"], seq_lens=c["lens"], cu_seqlens=c["cu"],
                        rope=True, write_k=True, **rope_kw, **{n: gk.asarray(x).to(dev) for n, x in sc_kw.items()})
        res[dev] = (np_of(kc), np_of(vc), np_of(kk))
    np.testing.assert_array_equal(res["cpu"][1].view(np.uint8), res["cuda"][1].view(np.uint8))  # v: a copy
    # k: fp32 sincos on the GPU vs double cos/sin on the CPU: at most one rounding step apart
    a, b = res["cpu"][2].astype(np.float64), res["cuda"][2].astype(np.float64)
    t = TOL[dtype] * 2
    bad = ~np.isclose(a, b, rtol=t, atol=t)
    assert not bad.any(), f"k_out: {bad.sum()} mismatches, first at {np.argwhere(bad)[0]}: cpu {a[bad][0]} cuda {b[bad][0]}"
    ka, kb = res["cpu"][0].astype(np.float64), res["cuda"][0].astype(np.float64)
    tc = 0.13 if fp8 else t
    bad = ~np.isclose(ka, kb, rtol=tc, atol=tc)
    assert not bad.any(), f"k cache: {bad.sum()} mismatches, first at {np.argwhere(bad)[0]}"
    # the GPU unfused path (rope on the GPU, then kv_append): report bit agreement, demand closeness
    kd = k.to("cuda")
    _, k2 = gk.nn.rope(make((T, 1, D), dtype).to("cuda"), kd, c["cache_pos"], **rope_kw)
    same = np.mean(np_of(k2).view(np.uint8) == res["cuda"][2].view(np.uint8))
    print(f"fused vs unfused GPU rope: {same * 100:.2f}% identical bytes")
    np.testing.assert_allclose(np_of(k2).astype(np.float64), b, rtol=t, atol=t)


@gpu
def test_cuda_device_positions_and_unvalidated_metadata():
    H, D, nb, bs = 2, 64, 4, 16
    k, v = make((2, H, D), "bfloat16").to("cuda"), make((2, H, D), "bfloat16").to("cuda")
    kc = gk.zeros((nb, bs, H, D), dtype="bfloat16").to("cuda")
    vc = gk.zeros((nb, bs, H, D), dtype="bfloat16").to("cuda")
    bad = gk.asarray(np.array([[0], [99]], np.int32)).to("cuda")
    lens = gk.asarray(np.array([0, 0], np.int32)).to("cuda")
    pos = gk.asarray(np.array([5, 6], np.int64)).to("cuda")
    gk.nn.kv_append(k, v, kc, vc, block_table=bad, seq_lens=lens, rope=True, positions=pos)  # token 1 skipped
    got = np_of(kc)
    kr = rope_ref(f64(k), np.array([5, 6]), 10000.0, D, False)
    np.testing.assert_allclose(got[0, 0].astype(np.float64), kr[0], rtol=1.6e-2, atol=1.6e-2)
    assert np.count_nonzero(got.reshape(-1, H * D).any(axis=1)) == 1
    assert not gk.cuda.is_failed()
