"""attention_decode, session 7 routing: the route bits of src/cuda/attention_decode.cu (kRouteDefault, or
GPUKIT_DECODE_ROUTE, which replaces it: 0 is session 6's routing), the cluster kernel of 4-warp CTAs (33), the
counter-merged 4-warp CTA groups (34; 36 with 2 stages per warp), the CTA kernel with one fence per CTA (35)
and the CTA kernels merged through tagged words (37: 18's CTAs, 38: 34's; test_cuda_tagged_merge).
Each must take the path it names (GPUKIT_DECODE_LOG) and give the fold kernels' common bits (the two-kernel fold
23, the CTA kernel 18), within the float64 reference, alone in its batch, in a captured graph and in a PDL chain;
the default (no GPUKIT_DECODE_ROUTE) must take the paths its route bits give, and GPUKIT_DECODE_ROUTE=0 session
6's."""
import re

import numpy as np
import pytest

import gpukit as gk
from decode_chain import chain_outs, check_chain, run_logged
from test_attention import TOL, f64, make
from test_attention_decode import bits, check, gpu, ref_decode

Hq, Hkv = 32, 8


def _case(B, T, D, dtype, seed):
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, T + 1, B).astype(np.int32)
    lens[0] = T
    if B > 2:
        lens[1] = 0
        lens[2] = 17
    kc = make((B, T, Hkv, D), dtype, seed + 1)
    vc = make((B, T, Hkv, D), dtype, seed + 2)
    q = make((B, Hq, D), dtype, seed + 3)
    return q, kc, vc, lens


def _auto(qd, kd, vd, ld, route, monkeypatch, capfd):
    monkeypatch.delenv("GPUKIT_DECODE_SPLIT", raising=False)
    if route is None:
        monkeypatch.delenv("GPUKIT_DECODE_ROUTE", raising=False)
    else:
        monkeypatch.setenv("GPUKIT_DECODE_ROUTE", str(route))
    return run_logged(lambda: gk.nn.attention_decode(qd, kd, vd, ld), monkeypatch, capfd, poison=False)


@gpu
@pytest.mark.parametrize("B,T,D,route,path,ref", [
    (3, 4096, 128, 1, "(31)", True),      # B3 T4096 -> pair clusters of 8-warp CTAs (route replaces the default)
    (3, 4096, 64, 1, "(31)", True),
    (12, 4096, 128, 2, "pair CTAs (28)", False),   # B12 -> pair kernel
    (12, 4096, 128, 4, "(31)", False),             # B12 -> pair clusters (two waves)
    (10, 4096, 128, 6, "pair CTAs (28)", False),   # 2 wins over 4
    (4, 384, 128, 8, "one group per CTA (24)", True),  # B2-8 short capacity -> cluster kernel (32 clusters of 2)
    (6, 384, 128, 8, "one group per CTA (24)", True),  # (48 clusters of 2 CTAs)
    (2, 1024, 64, 8, "one group per CTA (24)", True),  # (16 clusters of 4 CTAs)
    (1, 4096, 128, 16, "(33)", True),     # B1 long -> cluster of 4-warp CTAs
    (1, 4096, 64, 16, "(33)", True),
    (1, 16384, 128, 16, "cta (18)", False),  # (33 only up to 4096 keys)
    # (bit 32, B10 -> 28 and B12 -> 31: test_cuda_default_route)
    (8, 1024, 128, 64, "cta (18)", True),          # two waves of CTA group units, < 8 groups -> 18
    (2, 4096, 128, 128, "cta (18)", True),         # the same with >= 8 groups (candidate)
    (1, 16384, 128, 256, "one fence per CTA (35)", True),  # 18 with one fence per CTA (candidate)
    (5, 1000, 64, 320, "one fence per CTA (35)", True),  # (64: 18 at B5 T1000, then 256)
    (2, 4096, 128, 512, "4-warp CTA groups (34)", True),   # B2 -> 4-warp CTAs without cluster (candidate)
    (3, 2048, 64, 512, "4-warp CTA groups (34)", True),
    (8, 1024, 128, 512, "4-warp CTA groups (34)", False),
    (3, 4096, 128, 1024, "2 stages (36)", True),  # B3 -> 34 with 2 stages, three CTAs per SM (candidate)
    (5, 2048, 64, 1024, "2 stages (36)", True),   # (D 64: 3 stages)
    (3, 4096, 128, 0, "(23)", True),      # session 6's routing
    (1, 16384, 128, 2048, "tagged merge (37)", True),  # 18 -> 18 merged through tagged words (candidate)
    (1, 4096, 128, 2048, "tagged merge (37)", True),   # (bit 16 off: 18 -> 37)
    (1, 4096, 128, 16 | 2048, "(33)", True),           # 33 stays first
    (4, 1024, 128, 2048, "tagged merge (37)", True),   # B4 T1024: 18 -> 37 (128 units)
    (2, 1000, 64, 2048, "tagged merge (37)", True),
    (1, 16384, 128, 256 | 2048, "tagged merge (37)", True),       # 37 before 35
    (8, 1024, 128, 64 | 256 | 2048, "one fence per CTA (35)", False),  # two waves: 37 does not run, 35 does
    (2, 4096, 128, 4096, "tagged merge (38)", True),   # 34's shapes -> 34 with the tagged merge (candidate)
    (3, 2048, 64, 4096, "tagged merge (38)", True),
    (8, 1024, 128, 512 | 4096, "tagged merge (38)", False),  # 38 before 34
    (16, 512, 128, 4096, "tagged merge (38)", False),
    # session 8 candidates (test_attention_decode_clroute.py has paged / poisoned / chain cases)
    (16, 512, 128, 8192, "two groups per CTA (25)", False),  # B16 T512 -> 25 in clusters of one CTA
    (8, 1024, 128, 8 | 8192, "two groups per CTA (25)", False),  # (24 does not fit: 64 clusters of 4) -> 25
    (4, 1024, 128, 8192, "two groups per CTA (25)", True),    # B4 T1024: 18 -> 25 (32 clusters of 2)
    (2, 1024, 128, 8 | 8192, "one group per CTA (24)", True),  # 24 (all resident) stays first
    (16, 512, 128, 16384, "cluster of 4-warp CTAs (33)", False),
    (6, 1024, 128, 16384, "cluster of 4-warp CTAs (33)", False),
    (2, 1024, 64, 16384, "cluster of 4-warp CTAs (33)", True),
    (16, 512, 128, 8192 | 16384, "cluster of 4-warp CTAs (33)", False),  # 33 before 25 (session 8 final: 33 first)
    (2, 4096, 128, 4096 | 8192 | 16384, "tagged merge (38)", True),  # B2 T4096: 16 clusters of 8 / 16 do not all fit
    # session 9 prep (test_attention_decode_pdlroute.py has paged / poisoned / chain cases)
    (10, 4096, 128, 32 | 32768, "pair CTAs (28), no PDL", False),   # B10: 28 for two waves of 31 -> no PDL
    (12, 4096, 128, 2 | 32768, "pair CTAs (28), no PDL", False),    # (bit 2: B12 -> 28 as well)
    (16, 512, 128, 16384 | 65536, "cluster of 4-warp CTAs (33), PDL", False),
    (4, 1024, 128, 16384 | 65536, "cluster of 4-warp CTAs (33), PDL", True),
])
def test_cuda_route_candidates(B, T, D, route, path, ref, monkeypatch, capfd):
    dtype = "bfloat16" if D == 128 else "float16"
    q, kc, vc, lens = _case(B, T, D, dtype, 300 + B + D + route)
    kd, vd, ld, qd = (gk.asarray(x).to("cuda") for x in (kc, vc, lens, q))
    res = {}
    for v in ("23", "18", "28"):
        monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128," + v)
        res[v] = bits(gk.nn.attention_decode(qd, kd, vd, ld))
    for v in ("18", "28"):
        d = np.argwhere(res[v] != res["23"])
        assert d.size == 0, f"variant {v} differs from 23 at {d[0]} (B={B} T={T} D={D})"
    got, log = _auto(qd, kd, vd, ld, route, monkeypatch, capfd)
    assert path in log, f"GPUKIT_DECODE_ROUTE={route} at B={B} T={T} D={D} did not take {path}: {log!r}"
    d = np.argwhere(bits(got) != res["23"])
    assert d.size == 0, f"route {route} ({path}) differs from 23 at {d[0]} (B={B} T={T} D={D})"
    default, log0 = _auto(qd, kd, vd, ld, None, monkeypatch, capfd)
    np.testing.assert_array_equal(bits(default), res["23"], err_msg=f"default at B={B} T={T}: {log0!r}")
    if ref:
        check(got, ref_decode(f64(q), f64(kc), f64(vc), lens), TOL[dtype] * 2, f"route {route} B={B} T={T} D={D}")
    monkeypatch.setenv("GPUKIT_DECODE_ROUTE", str(route))
    for i in (0, B - 1):  # alone in its batch (another route, or the same)
        alone = gk.nn.attention_decode(qd[i:i + 1], kd[i:i + 1], vd[i:i + 1], ld[i:i + 1])
        np.testing.assert_array_equal(bits(alone)[0], res["23"][i], err_msg=f"sequence {i} alone (route {route})")
    g = gk.Graph()
    with g:
        out = gk.nn.attention_decode(qd, kd, vd, ld)
    for _ in range(2):
        g.replay()
        gk.cuda.synchronize()
        np.testing.assert_array_equal(bits(out), res["23"], err_msg=f"graph replay, route {route}")
    monkeypatch.delenv("GPUKIT_DECODE_ROUTE")


# The default's path at each shape as a function of the route bits in force (the log prints them, so the rows
# follow kRouteDefault if it changes): the first (bits, path) whose bits are all set, else the last path.
# Session 9's default (62011 = 1 | 2 | 8 | 16 | 32 | 512 | 4096 | 8192 | 16384 | 32768) takes the first column's comment;
# ROUTE=0 is session 6's.
_DEFAULT_ROWS = [
    (3, 4096, [(131072 | 262144, "(39), no PDL"), (131072, "(39)"), (1024, "(36)"), (1, "(31)")], "(23)", "(23)"),
    # 31 (bit 131072: 39's 24 clusters of 8 4-warp CTAs, resident on the H200 if its log says so)
    (10, 4096, [(2 | 32768, "(28), no PDL"), (2, "pair CTAs (28)"), (4, "(31)"), (32 | 32768, "(28), no PDL"),
                (32, "pair CTAs (28)")], "(23)", "(23)"),  # 28 (wave 2: 28/132)
    (12, 4096, [(2 | 32768, "(28), no PDL"), (2, "pair CTAs (28)"), (4, "(31)"), (32, "(31)")],
     "(23)", "(23)"),  # 31 (60/132)
    (14, 4096, [(2 | 32768, "(28), no PDL"), (2, "pair CTAs (28)"), (4, "(31)"), (32, "(31)")],
     "(23)", "(23)"),  # 31 (92/132)
    (2, 384, [(8, "one group per CTA (24)"), (2048, "(37)"), (256, "(35)")], "cta (18)", "cta (18)"),  # 24
    (8, 384, [(8, "one group per CTA (24)"), (2048, "(37)"), (256, "(35)")], "cta (18)", "cta (18)"),  # 24
    (4, 1024, [(16384 | 65536, "(33), PDL"), (16384, "(33)"), (8192, "(25)"), (2048, "(37)"), (256, "(35)")],
     "cta (18)", "cta (18)"),
    # 33 (24's 32 clusters of 4 CTAs do not all fit; 33's do)
    (8, 1024, [(8192, "(25)"), (4096, "(38)"), (512, "(34)"), (64 | 256, "(35)"), (64, "cta (18)")],
     "(23)", "(23)"),  # 25 (33's 64 clusters: 62 resident, so bit 16384 does not apply)
    (16, 512, [(16384 | 65536, "(33), PDL"), (16384, "(33)"), (8192, "(25)"), (4096, "(38)"), (512, "(34)"),
               (64 | 256, "(35)"), (64, "cta (18)")],
     "(23)", "(23)"),  # 33
    (6, 1024, [(16384 | 65536, "(33), PDL"), (16384, "(33)"), (8192, "(25)"), (4096, "(38)"), (512, "(34)"),
               (64 | 256, "(35)"), (64, "cta (18)")],
     "(23)", "(23)"),  # 33
    (1, 4096, [(16, "(33)"), (2048, "(37)"), (256, "(35)")], "cta (18)", "cta (18)"),   # 33
    (1, 16384, [(2048, "(37)"), (256, "(35)")], "cta (18)", "cta (18)"),  # 18 (33 only up to 4096 keys)
    (2, 4096, [(131072 | 262144, "(39), no PDL"), (131072, "(39)"), (4096, "(38)"), (512, "(34)"),
               (128 | 256, "(35)"), (128, "cta (18)")], "(23)", "(23)"),  # 38 (33 / 25 do not fit: 14 / 15 of 16)
]


def _expected(rules, fallback, route):
    for bits_, path in rules:
        if (route & bits_) == bits_:
            return path
    return fallback


@gpu
@pytest.mark.parametrize("B,T,rules,fallback,old", _DEFAULT_ROWS)
def test_cuda_default_route(B, T, rules, fallback, old, monkeypatch, capfd):
    # the default (no GPUKIT_DECODE_ROUTE) takes the path its route bits (logged) give, GPUKIT_DECODE_ROUTE=0
    # session 6's; both give 23's bits (and the float64 reference at B <= 3), and the default's alone / graph
    # bits equal too
    D, dtype = 128, "bfloat16"
    q, kc, vc, lens = _case(B, T, D, dtype, 500 + B + T)
    kd, vd, ld, qd = (gk.asarray(x).to("cuda") for x in (kc, vc, lens, q))
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128,23")
    want = bits(gk.nn.attention_decode(qd, kd, vd, ld))
    for route in (None, 0):
        got, log = _auto(qd, kd, vd, ld, route, monkeypatch, capfd)
        m = re.search(r"variant \d+ route (\d+):", log)
        assert m, f"no route bits in the log (B={B} T={T}): {log!r}"
        bits_in_force = int(m.group(1))
        if route is None:
            path = _expected(rules, fallback, bits_in_force)
        else:
            assert bits_in_force == 0, f"GPUKIT_DECODE_ROUTE=0 logged route {bits_in_force}"
            path = old
        assert path in log, f"route {route} (bits {bits_in_force}) at B={B} T={T} did not take {path}: {log!r}"
        d = np.argwhere(bits(got) != want)
        assert d.size == 0, f"route {route} ({path}) differs from 23 at {d[0]} (B={B} T={T})"
        if route is None:
            default = got
    monkeypatch.delenv("GPUKIT_DECODE_ROUTE", raising=False)
    if B <= 3:
        check(default, ref_decode(f64(q), f64(kc), f64(vc), lens), TOL[dtype] * 2, f"default B={B} T={T}")
    alone = gk.nn.attention_decode(qd[:1], kd[:1], vd[:1], ld[:1])
    np.testing.assert_array_equal(bits(alone)[0], want[0], err_msg=f"sequence 0 alone, default, B={B} T={T}")
    g = gk.Graph()
    with g:
        out = gk.nn.attention_decode(qd, kd, vd, ld)
    g.replay()
    gk.cuda.synchronize()
    np.testing.assert_array_equal(bits(out), want, err_msg=f"graph replay, default, B={B} T={T}")


@gpu
@pytest.mark.parametrize("var,route", [("33", 16), ("34", 512), ("36", 1024), ("37", 2048), ("38", 4096)])
@pytest.mark.parametrize("T,D", [(4096, 128), (16384, 128), (2500, 64)])
def test_cuda_cluster4_chain(T, D, var, route, monkeypatch, capfd):
    # 33 / 34 / 36 / 37 / 38 (forced, and auto with its route bit; 38's bit needs B >= 2: the bits of another path
    # here) at B = 1 (35, 18 with one fence per CTA: the fold tests):
    # a PDL chain out_{i+1} = decode(q = out_i) on poisoned allocations (a read before the write gives NaN) within
    # the float64 reference step by step, eager and PDL off and graph replay equal to 18's chain.
    dtype = "bfloat16"
    q, kc, vc, lens = _case(1, T, D, dtype, 400 + D)
    kd, vd, ld, qd = (gk.asarray(x).to("cuda") for x in (kc, vc, lens, q))
    kk, vv = f64(kc), f64(vc)

    def chain(n):
        return chain_outs(qd, kd, vd, ld, n)

    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128,18")
    base = [bits(o) for o in chain(3)]
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128," + var)
    poisoned, log = run_logged(lambda: chain(3), monkeypatch, capfd)
    assert f"({var})" in log, f"variant {var} did not run at B1 T{T} D{D}: {log!r}"
    check_chain(poisoned, q, kk, vv, lens, base, f"{var} chain T={T}", "18", f" (D={D})")
    g = gk.Graph()
    with g:
        graphed = chain(3)
    for _ in range(2):
        g.replay()
        gk.cuda.synchronize()
        for i, o in enumerate(graphed):
            np.testing.assert_array_equal(bits(o), base[i], err_msg=f"{var} graph step {i} T={T}")
    monkeypatch.setenv("GPUKIT_DECODE_PDL", "0")
    for i, o in enumerate(chain(3)):
        np.testing.assert_array_equal(bits(o), base[i], err_msg=f"{var} PDL off step {i} T={T}")
    monkeypatch.delenv("GPUKIT_DECODE_PDL")
    monkeypatch.delenv("GPUKIT_DECODE_SPLIT")
    monkeypatch.setenv("GPUKIT_DECODE_ROUTE", str(route))
    for i, o in enumerate(chain(3)):
        np.testing.assert_array_equal(bits(o), base[i], err_msg=f"route {route} step {i} T={T}")


@gpu
@pytest.mark.parametrize("var", ["37", "38"])
@pytest.mark.parametrize("D,hq,hkv,dtype",
                         [(128, 32, 8, "bfloat16"), (64, 12, 1, "float16"), (128, 64, 4, "bfloat16")])
def test_cuda_tagged_merge(D, hq, hkv, dtype, var, monkeypatch, capfd):
    # 37 / 38 (18's CTA group units / 34's 4-warp CTA groups, merged by the last CTA to start, polling tagged
    # 64-bit partials; attention_decode_ll.cuh): it must run (log), give 18's bits and the float64 reference;
    # calls with other lengths in between (every launch is a new epoch of the tags; sequences of 0 / 1 / several
    # groups in one batch; stale words of longer calls left in the slots), a graph replayed between eager calls
    # of other lengths (the graph has its own buffer), and a sequence alone must all give 18's bits.
    T, B = 2048, 2
    kc = make((B, T, hkv, D), dtype, 700 + D)
    vc = make((B, T, hkv, D), dtype, 701 + D)
    q = make((B, hq, D), dtype, 702 + D)
    kd, vd, qd = (gk.asarray(x).to("cuda") for x in (kc, vc, q))
    sets = [np.array(x, np.int32) for x in ([T, 700], [17, 0], [1500, T], [33, 1], [T, T], [257, 1999])]
    lds = [gk.asarray(x).to("cuda") for x in sets]
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128,18")
    want = [bits(gk.nn.attention_decode(qd, kd, vd, ld)) for ld in lds]
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128," + var)
    capfd.readouterr()
    monkeypatch.setenv("GPUKIT_DECODE_LOG", "1")
    first = gk.nn.attention_decode(qd, kd, vd, lds[0])
    gk.cuda.synchronize()
    log = capfd.readouterr().err
    monkeypatch.delenv("GPUKIT_DECODE_LOG")
    assert f"({var})" in log, f"{var} did not run (D={D} hq={hq} hkv={hkv}): {log!r}"
    check(first, ref_decode(f64(q), f64(kc), f64(vc), sets[0]), TOL[dtype] * 2, f"{var} D={D} hq={hq} hkv={hkv}")
    for rep in range(3):
        for i, ld in enumerate(lds):
            d = np.argwhere(bits(gk.nn.attention_decode(qd, kd, vd, ld)) != want[i])
            assert d.size == 0, f"{var} lengths {sets[i].tolist()} (pass {rep}) differ from 18 at {d[0]} (D={D})"
    g = gk.Graph()
    with g:
        out = gk.nn.attention_decode(qd, kd, vd, lds[4])
    for rep in range(3):
        g.replay()
        other = gk.nn.attention_decode(qd, kd, vd, lds[rep])
        gk.cuda.synchronize()
        np.testing.assert_array_equal(bits(out), want[4], err_msg=f"{var} graph replay {rep} (D={D})")
        np.testing.assert_array_equal(bits(other), want[rep], err_msg=f"{var} eager between replays {rep} (D={D})")
    alone = gk.nn.attention_decode(qd[1:2], kd[1:2], vd[1:2], lds[2][1:2])
    np.testing.assert_array_equal(bits(alone)[0], want[2][1], err_msg=f"{var} sequence 1 alone (D={D})")
