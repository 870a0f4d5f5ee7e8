"""attention_decode, the fold kernels (attention_decode_fold*.cu, the bf16/fp16 default): every unit choice and
variant bitwise equal (chunk, warp-group and CTA-group units, the pair-cluster kernels), windows and soft-cap,
and programmatic dependent launch (a chain of calls, each q the previous output). Split from
test_attention_decode.py, whose helpers it shares."""
import numpy as np
import pytest

import gpukit as gk
from decode_chain import chain_outs
from test_attention import TOL, f64, make
from test_attention_decode import bits, check, gpu, ref_decode, setup_compact

_FOLD_CASES = {}


def decode_chain(q, kc, vc, lens, n):
    """n attention_decode calls, each q the previous output; their bits, read after the whole chain (the
    launches overlap under PDL)."""
    return [bits(o) for o in chain_outs(q, kc, vc, lens, n)]


@gpu
@pytest.mark.parametrize("D,Hq,Hkv", [(128, 32, 8), (64, 12, 1), (128, 64, 4), (256, 16, 4)])
@pytest.mark.parametrize("params", ["32,1024,128", "64,256,16", "32,64,1000"])
def test_cuda_fold_units_same_bits(D, Hq, Hkv, params, monkeypatch):
    # the default kernels (attention_decode_fold*.cu): chunk units (partials merged by k_merge_fold), warp
    # group units (chunks folded in registers), CTA group units (one launch, folded through shared memory
    # and by the last CTA of each head) must give the same bits, and auto picks one of them; lengths with
    # 1 chunk, 1 group, several groups, a partial last group, windows, a paged cache; the float64 reference
    lens = np.array([1, 31, 32, 33, 255, 256, 257, 700, 2049, 5000, 0, 16385], np.int32)
    key = (D, Hq, Hkv)
    if key not in _FOLD_CASES:  # (the same data for the three parameter sets)
        q, kc, vc, bt = setup_compact(lens, Hq, Hkv, D, 32, "bfloat16", seed=D + Hq)
        dev = tuple(gk.asarray(x).to("cuda") for x in (q, kc, vc, lens, bt))
        _FOLD_CASES[key] = (dev, ref_decode(f64(q), f64(kc), f64(vc), lens, bt))
    (qd, kd, vd, ld, btd), want = _FOLD_CASES[key]
    base = params or "32,1024,128"
    res = {}
    for v in (",20", ",14", ",15", ",18", ",19", ",21", ",22", ",23", ",24", ",25", ",26", ",27",
              ",28", ",29", ",30", ",31", ",32", ",33", ",34", ",35", ",36", ",37", ",38", ",39"):
        monkeypatch.setenv("GPUKIT_DECODE_SPLIT", base + v)
        res[v] = gk.nn.attention_decode(qd, kd, vd, ld, block_table=btd)
    check(res[",20"], want, 3.2e-2, f"fold D={D} {base}")
    for v in (",14", ",15", ",18", ",19", ",21", ",22", ",23", ",24", ",25", ",26", ",27",
              ",28", ",29", ",30", ",31", ",32", ",33", ",34", ",35", ",36", ",37", ",38", ",39"):
        d = np.argwhere(bits(res[v]) != bits(res[",20"]))
        assert d.size == 0, f"units {v} differ from auto at {d[0]} (D={D} {base})"
    for i in (2, 9, 11):  # alone in its batch (another unit choice)
        monkeypatch.setenv("GPUKIT_DECODE_SPLIT", base + ",20")
        alone = gk.nn.attention_decode(qd[i:i + 1], kd, vd, ld[i:i + 1], block_table=btd[i:i + 1])
        np.testing.assert_array_equal(bits(alone)[0], bits(res[",20"])[i])


@gpu
@pytest.mark.parametrize("kw", [{"window": 100, "softcap": 3.0}, {"window": 2100}, {"window": 1}])
def test_cuda_fold_units_window_softcap(kw, monkeypatch):
    lens = np.array([4500, 2101, 64, 1, 3000, 40000], np.int32)
    q, kc, vc, bt = setup_compact(lens, 32, 8, 128, 64, "float16", seed=80)
    qd, kd, vd, ld, btd = (gk.asarray(x).to("cuda") for x in (q, kc, vc, lens, bt))
    want = ref_decode(f64(q), f64(kc), f64(vc), lens, bt, **kw)
    res = []
    for v in ("32,1024,128,14", "32,1024,128,15", "32,1024,128,18", "32,1024,128,21", "32,1024,128,24",
              "32,1024,128,25", "32,1024,128,28", "32,1024,128,29", "32,1024,128,30", "32,1024,128,31",
              "32,1024,128,32", "32,1024,128,33", "32,1024,128,34", "32,1024,128,35",
              "32,1024,128,36", "32,1024,128,37", "32,1024,128,38", "32,1024,128,39"):
        monkeypatch.setenv("GPUKIT_DECODE_SPLIT", v)
        res.append(gk.nn.attention_decode(qd, kd, vd, ld, block_table=btd, **kw))
    check(res[0], want, TOL["float16"] * 2, f"fold window/softcap {kw}")
    for r in res[1:]:
        np.testing.assert_array_equal(bits(res[0]), bits(r))


@gpu
@pytest.mark.parametrize("B,D,dtype", [(4, 128, "bfloat16"), (8, 128, "float16"), (5, 64, "bfloat16")])
def test_cuda_fold_pair_clusters(B, D, dtype, monkeypatch, capfd):
    # variants 30 / 31 / 32 (attention_decode_fold_pcl.cu: one warp per group, CTAs of 4 / 8 / 4 warps in clusters,
    # the groups folded through distributed shared memory; 32 with a deeper stage ring) at mid-size batches of a 4096-key contiguous cache: the
    # same bits as the two-kernel fold (23), the pair kernel (28) and auto; alone in the batch; repeated and in a
    # captured graph; a PDL chain (each q the previous output) equal to 23's chain, eager and with PDL off;
    # the float64 reference. Lengths: full, 1 group, a partial last group, 1 key, 0.
    Hq, Hkv, T = 32, 8, 4096
    rng = np.random.default_rng(100 + B)
    lens = rng.integers(1, T + 1, B).astype(np.int32)
    lens[0] = T
    lens[1] = 0
    lens[2] = 1
    if B > 3:
        lens[3] = 257
    kc = make((B, T, Hkv, D), dtype, 101)
    vc = make((B, T, Hkv, D), dtype, 102)
    q = make((B, Hq, D), dtype, 103)
    kd, vd, ld, qd = (gk.asarray(x).to("cuda") for x in (kc, vc, lens, q))
    want = ref_decode(f64(q), f64(kc), f64(vc), lens)
    res = {}
    for v in ("20", "23", "28", "30", "31", "32"):
        monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128," + v)
        res[v] = bits(gk.nn.attention_decode(qd, kd, vd, ld))
    # auto (session 6) routes these mid-size batches (one wave of 8-warp cluster CTAs, >= 3 groups per SM) to 31
    monkeypatch.delenv("GPUKIT_DECODE_SPLIT")
    capfd.readouterr()
    monkeypatch.setenv("GPUKIT_DECODE_LOG", "1")
    np.testing.assert_array_equal(bits(gk.nn.attention_decode(qd, kd, vd, ld)), res["20"])
    gk.cuda.synchronize()
    log = capfd.readouterr().err
    monkeypatch.delenv("GPUKIT_DECODE_LOG")
    assert "(31)" in log, f"auto at B={B} D={D} did not take the pair clusters of 8-warp CTAs (31): {log!r}"
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128,30")
    check(gk.nn.attention_decode(qd, kd, vd, ld), want, TOL[dtype] * 2, f"pair clusters B={B} D={D}")
    for v in ("20", "28", "30", "31", "32"):
        d = np.argwhere(res[v] != res["23"])
        assert d.size == 0, f"variant {v} differs from 23 at {d[0]} (B={B} D={D})"
    for v in ("30", "31", "32"):
        monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128," + v)
        for i in (0, 3):
            alone = gk.nn.attention_decode(qd[i:i + 1], kd[i:i + 1], vd[i:i + 1], ld[i:i + 1])
            np.testing.assert_array_equal(bits(alone)[0], res["23"][i])
        outs = []
        g = gk.Graph()
        with g:
            for _ in range(2):
                outs.append(gk.nn.attention_decode(qd, kd, vd, ld))
        for _ in range(2):
            g.replay()
            gk.cuda.synchronize()
            for o in outs:
                np.testing.assert_array_equal(bits(o), res["23"])

    def chain(n):
        return decode_chain(qd, kd, vd, ld, n)

    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128,23")
    base = chain(3)
    for v, pdl in (("30", "1"), ("31", "1"), ("32", "1"), ("30", "0")):
        monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128," + v)
        monkeypatch.setenv("GPUKIT_DECODE_PDL", pdl)
        for i, (a, b) in enumerate(zip(chain(3), base)):
            d = np.argwhere(a != b)
            assert d.size == 0, f"chain step {i} of variant {v} (PDL {pdl}) differs from 23 at {d[0]}"


@gpu
def test_cuda_fold_pair_clusters_small(monkeypatch, capfd):
    # a small case of the pair clusters (31 forced) for compute-sanitizer racecheck (the B5 T4096 case above did
    # not finish within its 100 s stage): 2 sequences x 2 kv heads, 2304 keys = 9 groups, so clusters of 2 CTAs
    # (the DSMEM fold across CTAs runs); 6 launches in all. 31 within the float64 reference, equal to 23, and a
    # PDL chain of 2 equal to 23's.
    B, Hq, Hkv, D, T, dtype = 2, 8, 2, 64, 2304, "bfloat16"
    lens = np.array([T, 1000], np.int32)
    kc = make((B, T, Hkv, D), dtype, 111)
    vc = make((B, T, Hkv, D), dtype, 112)
    q = make((B, Hq, D), dtype, 113)
    kd, vd, ld, qd = (gk.asarray(x).to("cuda") for x in (kc, vc, lens, q))
    res, chains = {}, {}
    for v in ("23", "31"):
        monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128," + v)
        capfd.readouterr()
        monkeypatch.setenv("GPUKIT_DECODE_LOG", "1")
        res[v] = gk.nn.attention_decode(qd, kd, vd, ld)
        gk.cuda.synchronize()
        log = capfd.readouterr().err
        monkeypatch.delenv("GPUKIT_DECODE_LOG")
        assert f"({v})" in log, f"variant {v} did not run (small pair-cluster case): {log!r}"
        chains[v] = decode_chain(qd, kd, vd, ld, 2)
    check(res["31"], ref_decode(f64(q), f64(kc), f64(vc), lens), TOL[dtype] * 2, "pair clusters small")
    d = np.argwhere(bits(res["31"]) != bits(res["23"]))
    assert d.size == 0, f"31 differs from 23 at {d[0]} (small case)"
    for i, (a, b) in enumerate(zip(chains["31"], chains["23"])):
        d = np.argwhere(a != b)
        assert d.size == 0, f"chain step {i} of 31 differs from 23 at {d[0]} (small case)"


@gpu
@pytest.mark.parametrize("B", [1, 3, 40])
def test_cuda_pdl_chain(B, monkeypatch):
    # The first decode kernel launches with PDL (it may start while the previous kernel finishes) and the last
    # one lets the next kernel launch early: a chain out_{i+1} = decode(q = out_i) reads each q only after the
    # call that writes it (poisoned allocations: a read before the write gives NaN), eagerly, in a captured
    # graph and with GPUKIT_DECODE_PDL=0 (the same bits). B = 1: cluster kernel, 3: CTA units, 40: the fold
    # kernel + merge kernel.
    Hq, Hkv, D, T = 32, 8, 128, 2304
    rng = np.random.default_rng(90 + B)
    lens = rng.integers(1, T + 1, B).astype(np.int32)
    lens[::4] = rng.integers(1, 40, len(lens[::4]))
    if B > 2:
        lens[1] = 0
    kc = make((B, T, Hkv, D), "bfloat16", 91)
    vc = make((B, T, Hkv, D), "bfloat16", 92)
    q = make((B, Hq, D), "bfloat16", 93)
    kd, vd, ld, qd = (gk.asarray(x).to("cuda") for x in (kc, vc, lens, q))
    kk, vv = f64(kc), f64(vc)

    def chain(n):
        return chain_outs(qd, kd, vd, ld, n)

    gk._C._debug_alloc_poison(0xFF)
    try:  # (the poison is a memset before each call's kernels: no overlap with the previous call)
        poisoned = chain(4)
    finally:
        gk._C._debug_alloc_poison(-1)
    prev = f64(q)
    for i, o in enumerate(poisoned):
        check(o, ref_decode(prev, kk, vv, lens), 3.2e-2, f"pdl chain B={B} step {i}")
        prev = f64(o)
    eager = chain(4)  # kernels back to back: each call's first kernel may overlap the previous call's last
    for i, (a, b) in enumerate(zip(eager, poisoned)):
        d = np.argwhere(bits(a) != bits(b))
        assert d.size == 0, f"eager step {i} differs from the poisoned run at {d[0]}"
    g = gk.Graph()
    with g:
        graphed = chain(4)
    for _ in range(2):
        g.replay()
        gk.cuda.synchronize()
        for i, (a, b) in enumerate(zip(graphed, eager)):
            d = np.argwhere(bits(a) != bits(b))
            assert d.size == 0, f"graph step {i} differs from eager at {d[0]}"
    monkeypatch.setenv("GPUKIT_DECODE_PDL", "0")
    for i, (a, b) in enumerate(zip(chain(4), eager)):
        d = np.argwhere(bits(a) != bits(b))
        assert d.size == 0, f"GPUKIT_DECODE_PDL=0 step {i} differs at {d[0]}"


@gpu
@pytest.mark.parametrize("T,D,dtype", [(384, 128, "bfloat16"), (1024, 128, "float16"), (300, 64, "bfloat16")])
def test_cuda_auto_cluster_short_b1(T, D, dtype, monkeypatch, capfd):
    # auto (session 6) at B = 1 with a short capacity (all clusters of one group per CTA resident) takes the
    # cluster kernel (24): the same bits as the CTA kernel (18) and the two-kernel fold (23), within the float64
    # reference, repeated in a captured graph, and in a PDL chain (each q the previous output) equal to 18's.
    Hq, Hkv = 32, 8
    for L in (1, 0, T - 37, T):  # (the chain below runs on the last: the full length)
        kc = make((1, T, Hkv, D), dtype, 201)
        vc = make((1, T, Hkv, D), dtype, 202)
        q = make((1, Hq, D), dtype, 203)
        lens = np.array([L], np.int32)
        kd, vd, ld, qd = (gk.asarray(x).to("cuda") for x in (kc, vc, lens, q))
        res = {}
        for v in ("18", "23", "24"):
            monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128," + v)
            res[v] = bits(gk.nn.attention_decode(qd, kd, vd, ld))
        monkeypatch.delenv("GPUKIT_DECODE_SPLIT")
        capfd.readouterr()
        monkeypatch.setenv("GPUKIT_DECODE_LOG", "1")
        got = gk.nn.attention_decode(qd, kd, vd, ld)
        gk.cuda.synchronize()
        log = capfd.readouterr().err
        monkeypatch.delenv("GPUKIT_DECODE_LOG")
        assert "one group per CTA (24)" in log, f"auto at B1 T{T} D{D} did not take the cluster kernel: {log!r}"
        for v in ("18", "23", "24"):
            np.testing.assert_array_equal(bits(got), res[v], err_msg=f"auto vs {v} at T{T} L{L} D{D}")
        if L > 0:
            check(got, ref_decode(f64(q), f64(kc), f64(vc), lens), TOL[dtype] * 2, f"auto cluster T{T} L{L}")
        g = gk.Graph()
        with g:
            out = gk.nn.attention_decode(qd, kd, vd, ld)
        for _ in range(2):
            g.replay()
            gk.cuda.synchronize()
            np.testing.assert_array_equal(bits(out), res["18"])

    def chain(n):
        return decode_chain(qd, kd, vd, ld, n)

    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128,18")
    base = chain(3)
    monkeypatch.delenv("GPUKIT_DECODE_SPLIT")
    for a, b in zip(chain(3), base):
        np.testing.assert_array_equal(a, b)
