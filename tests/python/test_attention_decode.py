"""attention_decode: page boundaries and odd lengths, the flash-decoding chunk regimes of the CUDA
kernels (chunks of 64..2048 keys, one-chunk sequences written directly), windows starting inside a
chunk, poisoned outputs, run-to-run determinism and batch invariance (bitwise), the split-parameter
override, the tensor-core kernels (bf16/fp16: attention_decode_mma.cu and the fold kernels
attention_decode_fold*.cu) against the CUDA-core one, and bad input. The fold kernels' unit kinds (every
variant bitwise equal) and the programmatic-dependent-launch chains are in test_attention_decode_fold.py.
References: float64 NumPy (ref_decode below, checked against
test_attention.ref_decode) and the CPU op."""
import numpy as np
import pytest

import gpukit as gk
from test_attention import TOL, f64, make, setup_paged
from test_attention import ref_decode as ref_decode_loop

CUDA = gk.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="no CUDA device")


def ref_decode(q, kc, vc, lens, bt=None, scale=None, window=None, softcap=None):
    """float64 reference of test_attention.ref_decode, all query heads of a kv head at once (matmuls instead of a
    loop over heads: the long sequences of these tests take seconds otherwise)."""
    B, Hq, D = q.shape
    bs, Hkv = kc.shape[1], kc.shape[2]
    G = Hq // Hkv
    scale = 1 / np.sqrt(D) if scale is None else scale
    out = np.zeros_like(q)
    for b in range(B):
        L = int(lens[b])
        st = max(0, L - window) if window else 0
        pos = np.arange(st, L)
        if len(pos) == 0:
            continue
        if bt is None:
            rk, rv = kc[b, pos], vc[b, pos]
        else:
            rk, rv = kc[bt[b, pos // bs], pos % bs], vc[bt[b, pos // bs], pos % bs]
        qg = q[b].reshape(Hkv, G, D)
        s = np.matmul(qg, rk.transpose(1, 2, 0)) * scale  # [Hkv, G, n]
        if softcap:
            s = softcap * np.tanh(s / softcap)
        p = np.exp(s - s.max(axis=2, keepdims=True))
        o = np.matmul(p, rv.transpose(1, 0, 2)) / p.sum(axis=2, keepdims=True)  # [Hkv, G, D]
        out[b] = o.reshape(Hq, D)
    return out


def test_fast_reference_matches_the_loop():
    lens = np.array([0, 1, 37, 300], np.int32)
    q, kc, vc, bt = setup_compact(lens, 12, 3, 64, 16, "float32", seed=3)
    qq, kk, vv = f64(q), f64(kc), f64(vc)
    for kw in ({}, {"window": 20, "softcap": 2.0}, {"scale": 0.3}):
        np.testing.assert_allclose(ref_decode(qq, kk, vv, lens, bt, **kw), ref_decode_loop(qq, kk, vv, lens, bt, **kw),
                                   rtol=1e-12, atol=1e-12)
    qc, kc2, vc2 = f64(make((2, 8, 64), "float32", 5)), f64(make((2, 50, 2, 64), "float32", 6)), \
        f64(make((2, 50, 2, 64), "float32", 7))
    lc = np.array([50, 9], np.int32)
    np.testing.assert_allclose(ref_decode(qc, kc2, vc2, lc), ref_decode_loop(qc, kc2, vc2, lc), rtol=1e-12, atol=1e-12)


def bits(x):
    a = gk.to_numpy(x)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def setup_compact(lens, Hq, Hkv, D, bs, dtype, seed=0):
    """A paged cache holding exactly the blocks the sequences use (shuffled), block tables padded
    with -1 past each length (never read), and 3 spare blocks."""
    nblk = [(int(L) + bs - 1) // bs for L in lens]
    nb = sum(nblk) + 3
    perm = np.random.default_rng(seed).permutation(nb).astype(np.int32)
    bt = np.full((len(lens), max(1, max(nblk))), -1, np.int32)
    o = 0
    for b, n in enumerate(nblk):
        bt[b, :n] = perm[o:o + n]
        o += n
    kc, vc = make((nb, bs, Hkv, D), dtype, seed + 1), make((nb, bs, Hkv, D), dtype, seed + 2)
    return make((len(lens), Hq, D), dtype, seed + 3), kc, vc, bt


def check(got, want, tol, what=""):
    g = got if isinstance(got, np.ndarray) else f64(got)
    err = np.abs(g - want)
    lim = tol + tol * np.abs(want)
    if not np.all(err <= lim) or not np.all(np.isfinite(g)):
        i = np.unravel_index(np.argmax(np.where(np.isfinite(err), err - lim, np.inf)), err.shape)
        raise AssertionError(f"{what}: max error {np.nanmax(err):.3g}, {np.sum(~(err <= lim))} bad of {err.size}; "
                             f"first worst at {i}: got {g[i]} want {want[i]}")


@pytest.mark.parametrize("bs", [16, 32])
def test_cpu_page_boundaries_and_odd_lengths(bs):
    lens = np.array([bs - 1, bs, bs + 1, 2 * bs - 1, 2 * bs + 1, 1, 3 * bs], np.int32)
    q, kc, vc, bt = setup_paged(len(lens), 6, 3, 64, bs, lens, "float32", seed=5)
    out = gk.nn.attention_decode(q, kc, vc, lens, block_table=bt)
    check(out, ref_decode(f64(q), f64(kc), f64(vc), lens, bt), 1e-5, "cpu paged")


def test_cpu_unused_block_table_entries_are_ignored():
    lens = np.array([3, 17], np.int32)
    q, kc, vc, bt = setup_paged(2, 4, 2, 64, 16, lens, "float32")
    bt = np.concatenate([bt, np.full((2, 3), -1, np.int32)], axis=1)  # padding past each length: never read
    bt[0, 1] = 10 ** 6
    out = gk.nn.attention_decode(q, kc, vc, lens, block_table=bt)
    check(out, ref_decode(f64(q), f64(kc), f64(vc), lens, bt), 1e-5, "padded block table")


def test_bad_inputs_more():
    lens = np.array([3, 4], np.int32)
    q, kc, vc, bt = setup_paged(2, 4, 2, 64, 16, lens, "float32")
    with pytest.raises(TypeError, match="v_cache: dtype"):
        gk.nn.attention_decode(q, kc, vc.astype("float16"), lens, block_table=bt)
    with pytest.raises(TypeError, match="q: dtype"):
        gk.nn.attention_decode(q.astype("int32"), kc, vc, lens, block_table=bt)
    with pytest.raises(ValueError, match="block_table: must be int32"):
        gk.nn.attention_decode(q, kc, vc, lens, block_table=bt.astype(np.int64))
    with pytest.raises(ValueError, match="block_table: must be int32"):
        gk.nn.attention_decode(q, kc, vc, lens, block_table=bt[:1])
    with pytest.raises(ValueError, match="q: shape"):
        gk.nn.attention_decode(q[0], kc, vc, lens, block_table=bt)
    with pytest.raises(ValueError, match="v_cache: shape"):
        gk.nn.attention_decode(q, kc, vc[:, :8], lens, block_table=bt)
    with pytest.raises(ValueError, match="head_dim 64 does not match"):
        gk.nn.attention_decode(make((2, 4, 128), "float32"), kc, vc, lens, block_table=bt)
    with pytest.raises(ValueError, match="seq_lens: must be int32"):
        gk.nn.attention_decode(q, kc, vc, np.array([3], np.int32), block_table=bt)
    with pytest.raises(ValueError, match="scale"):
        gk.nn.attention_decode(q, kc, vc, lens, block_table=bt, scale=float("nan"))
    with pytest.raises(ValueError, match="scales apply"):
        gk.nn.attention_decode(q, kc, vc, lens, block_table=bt, k_scale=np.ones(2, np.float32))
    # fp8: scales of the wrong shape / dtype
    k8, v8 = kc.astype("float8_e4m3fn"), vc.astype("float8_e4m3fn")
    with pytest.raises(ValueError, match="k_scale: must be float32"):
        gk.nn.attention_decode(q, k8, v8, lens, block_table=bt, k_scale=np.ones(3, np.float32),
                               v_scale=np.ones(2, np.float32))
    with pytest.raises(ValueError, match="v_scale: must be float32"):
        gk.nn.attention_decode(q, k8, v8, lens, block_table=bt, k_scale=np.ones(2, np.float32),
                               v_scale=np.ones(2, np.float64))
    # a length past the capacity of a contiguous cache
    cq, ck = make((2, 4, 64), "float32"), make((2, 5, 2, 64), "float32")
    with pytest.raises(ValueError, match="longer than the cache"):
        gk.nn.attention_decode(cq, ck, ck, np.array([5, 6], np.int32))


# ---------------------------------------------------------------- CUDA
def cuda_decode(q, kc, vc, lens, bt=None, **kw):
    return gk.nn.attention_decode(q.to("cuda"), kc.to("cuda"), vc.to("cuda"), gk.asarray(lens).to("cuda"),
                                  block_table=None if bt is None else gk.asarray(bt).to("cuda"), **kw)


@gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_cuda_chunk_regimes_vs_float64(dtype):
    # 1 chunk (<= 64 keys), up to 4 chunks of 64 .. 256 keys, 256-key chunks, then 512 and 1024-key chunks
    lens = np.array([1, 63, 256, 257, 2047, 2049, 4100, 16385, 0, 20000, 33000], np.int32)
    Hq, Hkv, D, bs = 32, 8, 128, 64
    q, kc, vc, bt = setup_compact(lens, Hq, Hkv, D, bs, dtype, seed=3)
    out = cuda_decode(q, kc, vc, lens, bt)
    check(out, ref_decode(f64(q), f64(kc), f64(vc), lens, bt), TOL[dtype] * 2, f"paged {dtype}")
    assert np.all(f64(out)[8] == 0)


@gpu
@pytest.mark.parametrize("D", [64, 256])
@pytest.mark.parametrize("Hq,Hkv", [(8, 8), (16, 2), (12, 1), (24, 4)])
def test_cuda_heads_and_dims(D, Hq, Hkv):
    lens = np.array([3000, 1, 700, 129], np.int32)
    q, kc, vc, bt = setup_compact(lens, Hq, Hkv, D, 16, "bfloat16", seed=D + Hq)
    out = cuda_decode(q, kc, vc, lens, bt)
    check(out, ref_decode(f64(q), f64(kc), f64(vc), lens, bt), 3.2e-2, f"D={D} Hq={Hq} Hkv={Hkv}")


@gpu
@pytest.mark.parametrize("kw", [{"window": 1}, {"window": 100}, {"window": 2100}, {"window": 5000},
                                {"window": 333, "softcap": 3.0}, {"softcap": 1.5, "scale": 0.05}])
def test_cuda_window_softcap(kw):
    B, Hq, Hkv, D, Tm = 3, 8, 2, 128, 4500
    q, kc, vc = (make(s, "bfloat16", i) for i, s in enumerate([(B, Hq, D), (B, Tm, Hkv, D), (B, Tm, Hkv, D)]))
    lens = np.array([4500, 2101, 64], np.int32)
    out = cuda_decode(q, kc, vc, lens, **kw)
    check(out, ref_decode(f64(q), f64(kc), f64(vc), lens, **kw), 3.2e-2, f"contiguous {kw}")


@gpu
def test_cuda_fp8_long_vs_cpu():
    lens = np.array([5000, 77], np.int32)
    Hq, Hkv, D, bs = 32, 8, 128, 32
    q, kc, vc, bt = setup_compact(lens, Hq, Hkv, D, bs, "float32", seed=9)
    ks = np.linspace(0.5, 1.5, Hkv).astype(np.float32)
    vs = ks[::-1].copy()
    k8 = gk.asarray(gk.to_numpy(kc) / ks[None, None, :, None]).astype("float8_e4m3fn")
    v8 = gk.asarray(gk.to_numpy(vc) / vs[None, None, :, None]).astype("float8_e4m3fn")
    qb = q.astype("bfloat16")
    want = gk.nn.attention_decode(qb, k8, v8, lens, block_table=bt, k_scale=ks, v_scale=vs)
    got = cuda_decode(qb, k8, v8, lens, bt, k_scale=gk.asarray(ks).to("cuda"), v_scale=gk.asarray(vs).to("cuda"))
    check(got, f64(want), 3.2e-2, "fp8 cuda vs cpu")


@gpu
def test_cuda_poisoned_outputs_and_determinism():
    lens = np.array([0, 1, 64, 65, 3000], np.int32)
    q, kc, vc, bt = setup_compact(lens, 8, 2, 128, 16, "bfloat16", seed=4)
    qd, kd, vd = q.to("cuda"), kc.to("cuda"), vc.to("cuda")
    ld, btd = gk.asarray(lens).to("cuda"), gk.asarray(bt).to("cuda")
    res, violations = [], []
    gk._C._debug_check_guards()  # clear what earlier code left
    for poison in (0xFF, 0x5A, 0xFF):
        gk._C._debug_alloc_poison(poison)
        try:
            out = gk.nn.attention_decode(qd, kd, vd, ld, block_table=btd)
        finally:
            gk._C._debug_alloc_poison(-1)
        violations += gk._C._debug_check_guards()
        res.append(bits(out))
    assert not violations, violations
    for r in res[1:]:
        diff = np.argwhere(r != res[0])
        assert diff.size == 0, f"{len(diff)} elements differ between poisons/runs, first at {diff[0]}"


@gpu
def test_cuda_batch_invariance_bitwise():
    Hq, Hkv, D, bs = 32, 8, 128, 16
    lens = np.array([4096, 17, 16385, 300, 1, 2049, 777, 64, 65], np.int32)
    B = len(lens)
    _, kc, vc, bt = setup_compact(lens, Hq, Hkv, D, bs, "bfloat16", seed=11)
    q32 = np.random.default_rng(12).standard_normal((B, Hq, D)).astype(np.float32)
    kd, vd = kc.to("cuda"), vc.to("cuda")

    def run(idx, lens_=None, bt_=None):
        ll = lens[idx] if lens_ is None else lens_
        tt = bt[idx] if bt_ is None else bt_
        qd = gk.asarray(np.ascontiguousarray(q32[idx])).astype("bfloat16").to("cuda")
        return bits(gk.nn.attention_decode(qd, kd, vd, gk.asarray(np.ascontiguousarray(ll)).to("cuda"),
                                           block_table=gk.asarray(np.ascontiguousarray(tt)).to("cuda")))

    full = run(np.arange(B))
    np.testing.assert_array_equal(full, run(np.arange(B)))  # run to run
    for i in range(B):  # each sequence alone
        alone = run(np.array([i]))
        d = np.argwhere(alone[0] != full[i])
        assert d.size == 0, f"sequence {i} (len {lens[i]}) alone differs from in-batch at {d[0]}"
    # reversed order, a duplicated batch of 2B, and a wider block table (another workspace stride)
    rev = run(np.arange(B)[::-1])
    np.testing.assert_array_equal(rev[::-1], full)
    dup = run(np.concatenate([np.arange(B), np.arange(B)]))
    np.testing.assert_array_equal(dup[:B], full)
    np.testing.assert_array_equal(dup[B:], full)
    wide = np.concatenate([bt, np.zeros((B, 2000), np.int32)], axis=1)
    np.testing.assert_array_equal(run(np.arange(B), bt_=wide), full)
    # neighbours of other lengths
    l2 = lens.copy()
    l2[[0, 1, 3]] = [1, 2000, 64]
    got = run(np.arange(B), lens_=l2)
    for i in range(B):
        if i not in (0, 1, 3):
            np.testing.assert_array_equal(got[i], full[i])


@gpu
@pytest.mark.parametrize("split", ["32,32,100000", "4096,4096,1", "64,1024,8", "64,512,32,1", "64,512,32,0,1",
                                   "128,512,16,1,1", "32,64,1000", "64,4096,2", "2048,2048,1,1", "64,2048,32,2",
                                   "64,256,64,3", "128,2048,16,4", "64,2048,32,5", "64,2048,32,6", "32,64,1000,7",
                                   "64,2048,32,8", "32,64,1000,9", "4096,4096,1,8", "256,4096,16,9",
                                   "64,2048,64,11", "32,64,1000,11", "64,2048,16,12", "32,64,1000,12",
                                   "4096,4096,1,12", "64,2048,16,13", "32,128,1000,13"])
def test_cuda_split_override(split, monkeypatch):
    lens = np.array([1, 4000, 9000, 333], np.int32)
    q, kc, vc, bt = setup_compact(lens, 16, 4, 128, 32, "bfloat16", seed=6)
    want = ref_decode(f64(q), f64(kc), f64(vc), lens, bt)
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", split)
    check(cuda_decode(q, kc, vc, lens, bt), want, 3.2e-2, f"split {split}")


def test_split_override_rejected(monkeypatch):
    lens = np.array([3, 4], np.int32)
    q, kc, vc, bt = setup_paged(2, 4, 2, 64, 16, lens, "float32")
    for bad in ("48,64,2", "64,512,32,40"):
        monkeypatch.setenv("GPUKIT_DECODE_SPLIT", bad)
        if CUDA:
            with pytest.raises(ValueError, match="GPUKIT_DECODE_SPLIT"):
                cuda_decode(q, kc, vc, lens, bt)
    out = gk.nn.attention_decode(q, kc, vc, lens, block_table=bt)  # the CPU reference has no split
    check(out, ref_decode(f64(q), f64(kc), f64(vc), lens, bt), 1e-5, "cpu with override set")


# ---- the tensor-core kernel (bf16 / fp16; attention_decode_mma.cu) and the CUDA-core one (variant 1) ----
CORE = "64,2048,64,1"  # the default chunking on the CUDA-core kernel


@gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("Hq,Hkv", [(32, 8), (8, 8), (12, 1), (40, 8), (6, 3), (64, 2), (16, 16)])
def test_cuda_mma_heads_dims(dtype, D, Hq, Hkv):
    # tile (16 keys) and chunk edges, an empty sequence, G = 1 .. 32 (groups of 8 query heads per item)
    lens = np.array([1, 700, 129, 64, 0, 2500, 15, 16, 17], np.int32)
    q, kc, vc, bt = setup_compact(lens, Hq, Hkv, D, 16, dtype, seed=D + Hq + Hkv)
    want = ref_decode(f64(q), f64(kc), f64(vc), lens, bt)
    check(cuda_decode(q, kc, vc, lens, bt), want, TOL[dtype] * 2, f"mma {dtype} D={D} Hq={Hq} Hkv={Hkv}")


@gpu
@pytest.mark.parametrize("bs", [16, 48, 256])
@pytest.mark.parametrize("kw", [{}, {"window": 100, "softcap": 3.0}, {"window": 2100}, {"scale": 0.05},
                                {"window": 1}])
def test_cuda_mma_paged_window_softcap(bs, kw):
    lens = np.array([4500, 2101, 64, 1, 3000], np.int32)
    q, kc, vc, bt = setup_compact(lens, 32, 8, 128, bs, "bfloat16", seed=bs)
    want = ref_decode(f64(q), f64(kc), f64(vc), lens, bt, **kw)
    check(cuda_decode(q, kc, vc, lens, bt, **kw), want, 3.2e-2, f"mma paged bs={bs} {kw}")


@gpu
def test_cuda_mma_many_items_per_warp():
    # hundreds of short sequences: each warp runs several items, and its copy pipeline crosses item
    # boundaries (items of 1 .. 12 tiles, empty sequences in between)
    rng = np.random.default_rng(30)
    lens = rng.integers(0, 200, 600).astype(np.int32)
    lens[::7] = 0
    lens[::11] = 1
    q, kc, vc, bt = setup_compact(lens, 8, 2, 64, 16, "float16", seed=31)
    want = ref_decode(f64(q), f64(kc), f64(vc), lens, bt)
    got = cuda_decode(q, kc, vc, lens, bt)
    check(got, want, TOL["float16"] * 2, "mma 600 sequences")
    for i in (0, 1, 5, 599):  # batch invariance with many items per warp
        alone = cuda_decode(q[i:i + 1], kc, vc, lens[i:i + 1], bt[i:i + 1])
        np.testing.assert_array_equal(bits(alone)[0], bits(got)[i])


@gpu
@pytest.mark.parametrize("B", [1, 37, 512, 513])
def test_cuda_mma_dense_items(B):
    # the item enumeration: dense (chunk-count prefix in shared memory, B <= 512) and the sparse order with
    # jumps over unused split slots (B > 512); lengths from 0 to several chunks, one long sequence that
    # sets the workspace stride; batch invariance against each sequence alone
    rng = np.random.default_rng(60 + B)
    lens = rng.integers(0, 1500, B).astype(np.int32)
    lens[::5] = rng.integers(0, 20, len(lens[::5]))
    lens[B // 2] = 9000
    q, kc, vc, bt = setup_compact(lens, 8, 2, 128, 16, "bfloat16", seed=61)
    want = ref_decode(f64(q), f64(kc), f64(vc), lens, bt)
    got = cuda_decode(q, kc, vc, lens, bt)
    check(got, want, 3.2e-2, f"mma B={B}")
    for i in sorted({0, B // 2, B - 1}):
        alone = cuda_decode(q[i:i + 1], kc, vc, lens[i:i + 1], bt[i:i + 1])
        d = np.argwhere(bits(alone)[0] != bits(got)[i])
        assert d.size == 0, f"B={B}: sequence {i} (len {lens[i]}) alone differs from in-batch at {d[0]}"


@gpu
def test_cuda_mma_strided_and_unaligned_q():
    lens = np.array([3000, 77, 1], np.int32)
    Hq, Hkv, D = 16, 4, 128
    _, kc, vc, bt = setup_compact(lens, Hq, Hkv, D, 32, "bfloat16", seed=40)
    kd, vd, ld, btd = (gk.asarray(x).to("cuda") for x in (kc, vc, lens, bt))
    big = make((3, 2 * Hq, D + 8), "bfloat16", seed=41).to("cuda")
    odd = make((3, Hq, D + 1), "bfloat16", seed=42).to("cuda")
    # 16-byte aligned rows (tensor-core kernel), then rows at an odd element offset (CUDA-core kernel)
    for name, q in (("strided", big[:, ::2, 8:]), ("strided", big[:, 1::2, :D]), ("unaligned", odd[:, :, 1:])):
        assert q.strides[2] == 1
        want = ref_decode(f64(q), f64(kc), f64(vc), lens, bt)
        check(gk.nn.attention_decode(q, kd, vd, ld, block_table=btd), want, 3.2e-2, f"{name} q")


@gpu
def test_cuda_mma_masked_blocks_and_capacity():
    # device block tables with ids outside the pool (masked keys, no validation) and lengths past the capacity
    lens = np.array([100, 40, 33], np.int32)
    q, kc, vc, bt = setup_compact(lens, 8, 2, 128, 16, "bfloat16", seed=50)
    bad = bt.copy()
    bad[0, 2] = 10 ** 6   # keys 32..47 of sequence 0 masked
    bad[1, :] = -5        # every key of sequence 1 masked: output 0
    out = f64(cuda_decode(q, kc, vc, lens, bad))
    assert np.all(np.isfinite(out)) and not gk.cuda.is_failed()
    assert np.all(out[1] == 0)
    keep = np.r_[0:32, 48:100]
    qq, kk, vv = f64(q), f64(kc), f64(vc)
    rows = [(bt[0, p // 16], p % 16) for p in keep]
    k0 = np.stack([kk[r] for r in rows])[None]
    v0 = np.stack([vv[r] for r in rows])[None]
    want0 = ref_decode(qq[:1], k0, v0, np.array([len(keep)], np.int32))
    check(out[0:1], want0, 3.2e-2, "masked block")


@gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_mma_matches_cuda_core_kernel(dtype, monkeypatch):
    lens = np.array([4096, 17, 9000, 300, 1, 129, 0], np.int32)
    q, kc, vc, bt = setup_compact(lens, 32, 8, 128, 16, dtype, seed=21)
    qd, kd, vd, ld, btd = (gk.asarray(x).to("cuda") for x in (q, kc, vc, lens, bt))
    fast = f64(gk.nn.attention_decode(qd, kd, vd, ld, block_table=btd))
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", CORE)
    core = f64(gk.nn.attention_decode(qd, kd, vd, ld, block_table=btd))
    check(fast, core, TOL[dtype] * 2, f"mma vs cuda-core {dtype}")


@gpu
@pytest.mark.parametrize("split", ["64,2048,32,8", "64,2048,16,12"])
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("Hq,Hkv", [(32, 8), (12, 1)])
def test_cuda_mma_cta_mode(Hq, Hkv, dtype, D, split, monkeypatch):
    # CTA mode: the warps of a CTA split each chunk (sub-chunks empty for short sequences) and combine
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", split)
    lens = np.array([1, 17, 63, 64, 65, 700, 5000, 0, 300], np.int32)
    q, kc, vc, bt = setup_compact(lens, Hq, Hkv, D, 16, dtype, seed=D + Hq)
    want = ref_decode(f64(q), f64(kc), f64(vc), lens, bt)
    got = cuda_decode(q, kc, vc, lens, bt)
    check(got, want, TOL[dtype] * 2, f"cta mode {split} {dtype} D={D} Hq={Hq} Hkv={Hkv}")
    for i in (0, 5, 6):
        alone = cuda_decode(q[i:i + 1], kc, vc, lens[i:i + 1], bt[i:i + 1])
        np.testing.assert_array_equal(bits(alone)[0], bits(got)[i])
    np.testing.assert_array_equal(bits(cuda_decode(q, kc, vc, lens, bt)), bits(got))


@gpu
@pytest.mark.parametrize("split", ["64,2048,16,12", "64,2048,16,13", "64,2048,64", "64,2048,64,11",
                                   "32,1024,128,18", "32,1024,128,19", "32,1024,128,20", "32,1024,128,21",
                                   "32,1024,128,33", "32,1024,128,34", "32,1024,128,35",
                                   "32,1024,128,36", "32,1024,128,37", "32,1024,128,38"])
def test_cuda_mma_in_kernel_merge_graph_and_reuse(split, monkeypatch):
    # CTA mode with the in-kernel merge (integer counters per sequence x kv head, left zeroed by the CTA
    # that merges): repeated launches, other lengths, a captured graph replayed several times and direct
    # launches in between, all bitwise equal to the first run; batch invariance and the float64 reference
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", split)
    lens = np.array([5000, 0, 1, 700, 16385, 64, 65, 3000], np.int32)
    q, kc, vc, bt = setup_compact(lens, 32, 8, 128, 16, "bfloat16", seed=70)
    qd, kd, vd, ld, btd = (gk.asarray(x).to("cuda") for x in (q, kc, vc, lens, bt))
    want = ref_decode(f64(q), f64(kc), f64(vc), lens, bt)
    first = gk.nn.attention_decode(qd, kd, vd, ld, block_table=btd)
    check(first, want, 3.2e-2, f"in-kernel merge {split}")
    ref = bits(first)
    for _ in range(3):
        np.testing.assert_array_equal(bits(gk.nn.attention_decode(qd, kd, vd, ld, block_table=btd)), ref)
    l2 = gk.asarray(np.array([17, 9000, 0, 2, 100, 64, 4000, 1], np.int32)).to("cuda")
    gk.nn.attention_decode(qd, kd, vd, l2, block_table=btd)  # other counts in between
    for i in (0, 4):
        alone = gk.nn.attention_decode(qd[i:i + 1], kd, vd, ld[i:i + 1], block_table=btd[i:i + 1])
        np.testing.assert_array_equal(bits(alone)[0], ref[i])
    outs = []
    g = gk.Graph()
    with g:
        for _ in range(3):
            outs.append(gk.nn.attention_decode(qd, kd, vd, ld, block_table=btd))
    for _ in range(3):
        g.replay()
        gk.cuda.synchronize()
        for o in outs:
            np.testing.assert_array_equal(bits(o), ref)
        np.testing.assert_array_equal(bits(gk.nn.attention_decode(qd, kd, vd, ld, block_table=btd)), ref)
