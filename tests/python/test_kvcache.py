"""kv_append into paged and contiguous caches (slot mapping, block table, varlen),
fp8-e4m3 caches with per-head scales, and bounds checks before any launch."""
import numpy as np
import pytest

import gpukit as gk

CUDA = gk.cuda.is_available()
DTYPES = ["float32", "float16", "bfloat16"]


def make(shape, dtype, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return gk.asarray(a).astype(dtype)


def np_of(x):
    return gk.to_numpy(x).copy()


def poisoned_cache(shape, dtype, device="cpu"):
    c = gk.full(shape, 7.0, dtype=dtype)  # poison: untouched slots must keep it
    return c.to(device) if device != "cpu" else c


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("slot_dtype", [np.int32, np.int64])
def test_slot_mapping(dtype, slot_dtype):
    T, H, D, nb, bs = 6, 2, 8, 5, 16
    k, v = make((T, H, D), dtype, 1), make((T, H, D), dtype, 2)
    kc, vc = poisoned_cache((nb, bs, H, D), dtype), poisoned_cache((nb, bs, H, D), dtype)
    slots = np.array([0, 17, -1, 79, 33, 5], slot_dtype)  # -1: padding, skipped
    want_k, want_v = np_of(kc).reshape(nb * bs, H, D), np_of(vc).reshape(nb * bs, H, D)
    for t, s in enumerate(slots):
        if s >= 0:
            want_k[s], want_v[s] = np_of(k)[t], np_of(v)[t]
    gk.nn.kv_append(k, v, kc, vc, slot_mapping=slots)
    np.testing.assert_array_equal(np_of(kc).reshape(nb * bs, H, D), want_k)
    np.testing.assert_array_equal(np_of(vc).reshape(nb * bs, H, D), want_v)


def paged_ref(kc, k, bt, lens, cu):
    out = kc.copy()
    bs = kc.shape[1]
    for b in range(len(lens)):
        for j in range(cu[b], cu[b + 1]):
            pos = lens[b] + (j - cu[b])
            out[bt[b, pos // bs], pos % bs] = k[j]
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bs", [16, 32, 256])
def test_paged_block_table(dtype, bs):
    H, D, nb = 3, 16, 9
    lens = np.array([0, 15, bs + 3, 2], np.int32)
    n_new = np.array([3, 2, 1, 0])
    cu = np.concatenate([[0], np.cumsum(n_new)]).astype(np.int32)
    T = int(cu[-1])
    bt = np.array([[4, 0, 1], [2, 3, 0], [7, 8, 1], [5, 6, 6]], np.int32)
    k, v = make((T, H, D), dtype, 1), make((T, H, D), dtype, 2)
    kc, vc = poisoned_cache((nb, bs, H, D), dtype), poisoned_cache((nb, bs, H, D), dtype)
    wk, wv = paged_ref(np_of(kc), np_of(k), bt, lens, cu), paged_ref(np_of(vc), np_of(v), bt, lens, cu)
    gk.nn.kv_append(k, v, kc, vc, block_table=bt, seq_lens=lens, cu_seqlens=cu)
    np.testing.assert_array_equal(np_of(kc), wk)
    np.testing.assert_array_equal(np_of(vc), wv)


def test_decode_one_token_per_sequence_and_contiguous():
    B, Tmax, H, D = 3, 10, 2, 4
    k, v = make((B, H, D), "float32", 1), make((B, H, D), "float32", 2)
    kc, vc = poisoned_cache((B, Tmax, H, D), "float32"), poisoned_cache((B, Tmax, H, D), "float32")
    lens = np.array([0, 9, 4], np.int32)
    gk.nn.kv_append(k, v, kc, vc, seq_lens=lens)  # contiguous cache [B, T_max, H, D]
    got = np_of(kc)
    for b in range(B):
        np.testing.assert_array_equal(got[b, lens[b]], np_of(k)[b])
    mask = np.ones((B, Tmax), bool)
    mask[np.arange(B), lens] = False
    assert np.all(got[mask] == 7.0)
    # strided k_new (a view into a fused kv buffer)
    kv = make((B, 2 * H, D), "float32", 3)
    kc2, vc2 = poisoned_cache((B, Tmax, H, D), "float32"), poisoned_cache((B, Tmax, H, D), "float32")
    gk.nn.kv_append(kv[:, :H], kv[:, H:], kc2, vc2, seq_lens=lens)
    np.testing.assert_array_equal(np_of(vc2)[np.arange(B), lens], np_of(kv)[:, H:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_cache(dtype):
    import ml_dtypes
    T, H, D, nb, bs = 4, 2, 16, 2, 16
    k, v = make((T, H, D), dtype, 1), make((T, H, D), dtype, 2)
    kc = gk.zeros((nb, bs, H, D), dtype="float8_e4m3fn")
    vc = gk.zeros((nb, bs, H, D), dtype="float8_e4m3fn")
    ks, vs = np.array([0.5, 2.0], np.float32), np.array([0.01, 1.0], np.float32)
    slots = np.array([3, 4, 20, 31])
    gk.nn.kv_append(k, v, kc, vc, slot_mapping=slots, k_scale=ks, v_scale=vs)
    gotk = np_of(kc).astype(np.float32).reshape(nb * bs, H, D)[slots]
    gotv = np_of(vc).astype(np.float32).reshape(nb * bs, H, D)[slots]
    wk = (np_of(k).astype(np.float32) / ks[None, :, None]).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    wv = np.clip(np_of(v).astype(np.float32) / vs[None, :, None], -448, 448)
    wv = wv.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(gotk, wk)
    np.testing.assert_array_equal(gotv, wv)
    with pytest.raises(ValueError, match="k_scale"):
        gk.nn.kv_append(k, v, kc, vc, slot_mapping=slots)


def test_bad_inputs():
    H, D, nb, bs = 2, 8, 4, 16
    k, v = make((2, H, D), "float32"), make((2, H, D), "float32")
    kc, vc = gk.zeros((nb, bs, H, D), dtype="float32"), gk.zeros((nb, bs, H, D), dtype="float32")
    before = np_of(kc)
    with pytest.raises(IndexError, match="slot_mapping: slot 64"):
        gk.nn.kv_append(k, v, kc, vc, slot_mapping=np.array([0, 64]))
    with pytest.raises(IndexError, match="block_table: block id 4"):
        gk.nn.kv_append(k, v, kc, vc, block_table=np.array([[0], [4]], np.int32), seq_lens=np.array([0, 0], np.int32))
    with pytest.raises(IndexError, match="block_table: block id -1"):
        gk.nn.kv_append(k, v, kc, vc, block_table=np.array([[0, -1], [1, 2]], np.int32),
                        seq_lens=np.array([16, 0], np.int32))
    with pytest.raises(ValueError, match="capacity"):
        gk.nn.kv_append(k, v, kc, vc, block_table=np.array([[0], [1]], np.int32), seq_lens=np.array([16, 0], np.int32))
    with pytest.raises(ValueError, match="capacity"):
        gk.nn.kv_append(k, v, gk.zeros((2, 5, H, D), dtype="float32"), gk.zeros((2, 5, H, D), dtype="float32"),
                        seq_lens=np.array([5, 0], np.int32))
    with pytest.raises(ValueError, match="negative"):
        gk.nn.kv_append(k, v, kc, vc, block_table=np.array([[0], [1]], np.int32), seq_lens=np.array([-1, 0], np.int32))
    with pytest.raises(ValueError, match="block_size"):
        c = gk.zeros((4, 8, H, D), dtype="float32")
        gk.nn.kv_append(k, v, c, c, block_table=np.array([[0], [1]], np.int32), seq_lens=np.array([0, 0], np.int32))
    with pytest.raises(TypeError, match="k_cache: dtype"):
        c = gk.zeros((nb, bs, H, D), dtype="float16")
        gk.nn.kv_append(k, v, c, c, slot_mapping=np.array([0, 1]))
    with pytest.raises(TypeError, match="v_new: dtype"):
        gk.nn.kv_append(k, v.astype("bfloat16"), kc, vc, slot_mapping=np.array([0, 1]))
    with pytest.raises(ValueError, match="k_cache: shape"):
        c = gk.zeros((nb, bs, H, 4), dtype="float32")
        gk.nn.kv_append(k, v, c, c, slot_mapping=np.array([0, 1]))
    with pytest.raises(ValueError, match="cu_seqlens"):
        gk.nn.kv_append(k, v, kc, vc, block_table=np.array([[0]], np.int32), seq_lens=np.array([0], np.int32),
                        cu_seqlens=np.array([0, 3], np.int32))
    with pytest.raises(ValueError, match="seq_lens"):
        gk.nn.kv_append(k, v, kc, vc)
    with pytest.raises(TypeError, match="block_table: dtype"):
        gk.nn.kv_append(k, v, kc, vc, block_table=np.array([[0], [1]]), seq_lens=np.array([0, 0], np.int32))
    np.testing.assert_array_equal(np_of(kc), before)  # nothing was written


gpu = pytest.mark.skipif(not CUDA, reason="no CUDA device")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 128, 6])
@pytest.mark.parametrize("fp8", [False, True])
def test_cuda_matches_cpu(dtype, D, fp8):
    H, nb, bs = 4, 12, 32
    lens = np.array([0, 31, 70, 5], np.int32)
    cu = np.array([0, 5, 6, 9, 9], np.int32)
    bt = np.array([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]], np.int32)
    T = int(cu[-1])
    k, v = make((T, H, D), dtype, 1), make((T, H, D), dtype, 2)
    cdt = "float8_e4m3fn" if fp8 else dtype
    sc = dict(k_scale=np.full(H, 0.5, np.float32), v_scale=np.linspace(0.1, 2, H).astype(np.float32)) if fp8 else {}
    res = []
    for dev in ("cpu", "cuda"):
        kc, vc = gk.zeros((nb, bs, H, D), dtype=cdt).to(dev), gk.zeros((nb, bs, H, D), dtype=cdt).to(dev)
        scd = {n: gk.asarray(x).to(dev) for n, x in sc.items()}
        gk.nn.kv_append(k.to(dev), v.to(dev), kc, vc, block_table=bt, seq_lens=lens, cu_seqlens=cu, **scd)
        res.append((np_of(kc), np_of(vc)))
    for a, b in zip(res[0], res[1]):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@gpu
def test_cuda_device_metadata_guarded_and_validated():
    H, D, nb, bs = 2, 8, 4, 16
    k, v = make((2, H, D), "float32").to("cuda"), make((2, H, D), "float32").to("cuda")
    kc, vc = gk.zeros((nb, bs, H, D), dtype="float32").to("cuda"), gk.zeros((nb, bs, H, D), dtype="float32").to("cuda")
    bad = gk.asarray(np.array([[0], [99]], np.int32)).to("cuda")
    lens = gk.asarray(np.array([0, 0], np.int32)).to("cuda")
    with pytest.raises(IndexError, match="block id 99"):
        gk.nn.kv_append(k, v, kc, vc, block_table=bad, seq_lens=lens, validate=True)
    gk.nn.kv_append(k, v, kc, vc, block_table=bad, seq_lens=lens)  # unvalidated: token 1 skipped, no OOB write
    got = np_of(kc)
    np.testing.assert_array_equal(got[0, 0], np_of(k)[0])
    assert np.count_nonzero(got) == np.count_nonzero(np_of(k)[0])
    assert not gk.cuda.is_failed()
