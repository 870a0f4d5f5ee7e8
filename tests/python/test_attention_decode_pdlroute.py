"""attention_decode, session 9 prep: the PDL route bits of src/cuda/attention_decode.cu (kRouteDefault).
32768: auto's pair kernel (28) where it replaces two waves of 31's CTAs (B9 / B10 at ~4096 keys, Hkv 8) launched
without PDL (path "pair CTAs (28), no PDL"); 28 chosen for full waves (B16 T4096) keeps PDL. 65536: bit 16384's
cluster kernel of 4-warp CTAs (33) at B >= 2 launched with PDL (path "cluster of 4-warp CTAs (33), PDL"). Same
kernels, so the same bits as 23 (and the float64 reference), on poisoned allocations, contiguous and paged, with
per-sequence odd lengths, alone in the batch, in a PDL chain (out_i as the next q) and in a replayed graph.
The CPU part checks that the route values are accepted (the CPU backend ignores the route)."""
import numpy as np
import pytest

import gpukit as gk
from decode_chain import chain_outs, check_chain, run_logged
from test_attention import TOL, f64, make
from test_attention_decode import bits, check, gpu, ref_decode
from test_attention_decode_clroute import _call, _data

Hq, Hkv = 32, 8
DEFAULT = 29241  # session 8's default (the base of these rows; the compiled default is 62011 = 29241 | 2 | 32768 since session 9)
NEW_BITS = (32768, 65536)


def test_route_bits_accepted_cpu(monkeypatch):
    # every route value the request lines use is accepted (the CUDA side reads GPUKIT_DECODE_ROUTE with atoi, no
    # bound; bench/attention.py passes env entries through); the CPU result does not depend on it
    B, T, D = 3, 40, 64
    q, kc, vc = make((B, Hq, D), "float32", 1), make((B, T, Hkv, D), "float32", 2), make((B, T, Hkv, D), "float32", 3)
    lens = np.array([T, 0, 17], np.int32)
    monkeypatch.delenv("GPUKIT_DECODE_ROUTE", raising=False)
    want = gk.to_numpy(gk.nn.attention_decode(gk.asarray(q), gk.asarray(kc), gk.asarray(vc), gk.asarray(lens)))
    for route in (DEFAULT, DEFAULT | 32768, DEFAULT | 65536, DEFAULT | 32768 | 65536, 32768, 65536):
        monkeypatch.setenv("GPUKIT_DECODE_ROUTE", str(route))
        got = gk.to_numpy(gk.nn.attention_decode(gk.asarray(q), gk.asarray(kc), gk.asarray(vc), gk.asarray(lens)))
        np.testing.assert_array_equal(got, want, err_msg=f"route {route}")
    check(want, ref_decode(f64(q), f64(kc), f64(vc), lens), 1e-5, "cpu")


def _run_logged(fn, monkeypatch, capfd, poison):
    return run_logged(fn, monkeypatch, capfd, poison, guards=True)


# (B, T, D, dtype, paged, route, path, absent, ref): the path the route must log, a text it must not, and whether
# to check the float64 reference as well (the rows that only check a path compare bits with 23, whose float64 checks
# are elsewhere: the long float64 references would take the line past its time)
_CASES = [
    (10, 4096, 128, "bfloat16", False, DEFAULT | 32768, "pair CTAs (28), no PDL", None, True),
    (10, 4096, 128, "bfloat16", True, DEFAULT | 32768, "pair CTAs (28), no PDL", None, True),
    (9, 4000, 64, "float16", False, DEFAULT | 32768, "pair CTAs (28), no PDL", None, True),  # 72 pairs: 28 (wave 2)
    (10, 4096, 128, "bfloat16", False, DEFAULT, "pair CTAs (28)", "no PDL", False),     # bit off: PDL as before
    (16, 4096, 128, "bfloat16", False, DEFAULT | 32768, "pair CTAs (28)", "no PDL", False),  # full wave: keeps PDL
    (12, 4096, 128, "bfloat16", False, DEFAULT | 32768, "(31)", "(28)", False),         # 31 unchanged
    (12, 4096, 128, "bfloat16", False, DEFAULT | 2 | 32768, "pair CTAs (28), no PDL", None, True),  # with bit 2: 28
    (14, 4096, 128, "bfloat16", False, DEFAULT | 2 | 32768, "pair CTAs (28), no PDL", None, False),  # (112 pairs)
    (14, 4096, 128, "bfloat16", False, DEFAULT | 2, "pair CTAs (28)", "no PDL", False),  # bit 2 alone: PDL
    (16, 512, 128, "bfloat16", False, DEFAULT | 65536, "cluster of 4-warp CTAs (33), PDL", None, True),
    (16, 512, 128, "bfloat16", True, DEFAULT | 65536, "cluster of 4-warp CTAs (33), PDL", None, True),
    (6, 1000, 128, "float16", False, DEFAULT | 65536, "cluster of 4-warp CTAs (33), PDL", None, True),
    (4, 1024, 64, "float16", True, DEFAULT | 65536, "cluster of 4-warp CTAs (33), PDL", None, True),
    (16, 512, 128, "bfloat16", False, DEFAULT, "cluster of 4-warp CTAs (33)", ", PDL", False),  # bit off: no PDL
    (1, 4096, 128, "bfloat16", False, DEFAULT | 65536, "cluster of 4-warp CTAs (33)", ", PDL", True),  # B1: bit 16's
]


@gpu
@pytest.mark.parametrize("B,T,D,dtype,paged,route,path,absent,ref", _CASES)
def test_cuda_pdl_route(B, T, D, dtype, paged, route, path, absent, ref, monkeypatch, capfd):
    q, kc, vc, lens, bt = _data(B, T, D, dtype, paged, 1300 + B + D + (50 if paged else 0))
    kd, vd, ld, qd = (gk.asarray(x).to("cuda") for x in (kc, vc, lens, q))
    btd = gk.asarray(bt).to("cuda") if paged else None
    monkeypatch.delenv("GPUKIT_DECODE_ROUTE", raising=False)
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128,23")
    want = bits(_call(qd, kd, vd, ld, btd))
    monkeypatch.delenv("GPUKIT_DECODE_SPLIT")
    monkeypatch.setenv("GPUKIT_DECODE_ROUTE", str(route))
    got, log = _run_logged(lambda: _call(qd, kd, vd, ld, btd), monkeypatch, capfd, True)
    assert path in log, f"route {route} at B={B} T={T} D={D} paged={paged} did not take {path}: {log!r}"
    if absent:
        assert absent not in log, f"route {route} at B={B} T={T}: {absent!r} in {log!r}"
    d = np.argwhere(bits(got) != want)
    assert d.size == 0, (f"route {route} ({path}) differs from 23 at {d[0]} of {d.shape[0]} "
                         f"(B={B} T={T} D={D} paged={paged}, lengths {lens.tolist()[:8]})")
    assert np.all(np.isfinite(f64(got))), f"route {route}: non-finite outputs (an element not written?)"
    if ref:
        check(got, ref_decode(f64(q), f64(kc), f64(vc), lens, bt), TOL[dtype] * 2,
              f"route {route} B={B} T={T} D={D} paged={paged}")
    for i in sorted({0, min(2, B - 1), B - 1}):  # alone in its batch (a one-sequence call takes another path)
        alone = _call(qd[i:i + 1], kd if paged else kd[i:i + 1], vd if paged else vd[i:i + 1], ld[i:i + 1],
                      btd[i:i + 1] if paged else None)
        np.testing.assert_array_equal(bits(alone)[0], want[i], err_msg=f"sequence {i} alone, route {route}")
    g = gk.Graph()  # the route is read at capture time
    with g:
        out = _call(qd, kd, vd, ld, btd)
    for _ in range(2):
        g.replay()
        gk.cuda.synchronize()
        np.testing.assert_array_equal(bits(out), want, err_msg=f"graph replay, route {route}")
    monkeypatch.delenv("GPUKIT_DECODE_ROUTE")


@gpu
@pytest.mark.parametrize("bit,B,T,path", [(32768, 10, 4096, "pair CTAs (28), no PDL"),
                                          (65536, 16, 512, "cluster of 4-warp CTAs (33), PDL")])
def test_cuda_pdl_route_chain(bit, B, T, path, monkeypatch, capfd):
    # a chain out_{i+1} = decode(q = out_i) on poisoned allocations (a read of q before the previous call's write
    # gives NaN), each step within the float64 reference and equal to 23's chain; the default route's chain equal
    D, dtype = 128, "bfloat16"
    q, kc, vc, lens, _ = _data(B, T, D, dtype, False, 1990 + B)
    kd, vd, ld, qd = (gk.asarray(x).to("cuda") for x in (kc, vc, lens, q))
    kk, vv = f64(kc), f64(vc)

    def chain(n):
        return chain_outs(qd, kd, vd, ld, n)

    monkeypatch.delenv("GPUKIT_DECODE_ROUTE", raising=False)
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128,23")
    base = [bits(o) for o in chain(3)]
    monkeypatch.delenv("GPUKIT_DECODE_SPLIT")
    monkeypatch.setenv("GPUKIT_DECODE_ROUTE", str(DEFAULT | bit))
    poisoned, log = _run_logged(lambda: chain(3), monkeypatch, capfd, True)
    assert log.count(path) == 3, f"bit {bit}: {path} not in every step: {log!r}"
    check_chain(poisoned, q, kk, vv, lens, base, f"bit {bit} chain", "23")
    # mixed: the new launch form between default-route calls (PDL edges both ways)
    x = qd
    for i in range(3):
        monkeypatch.setenv("GPUKIT_DECODE_ROUTE", str(DEFAULT if i % 2 else DEFAULT | bit))
        x = gk.nn.attention_decode(x, kd, vd, ld)
        np.testing.assert_array_equal(bits(x), base[i], err_msg=f"bit {bit} mixed chain step {i}")
    monkeypatch.delenv("GPUKIT_DECODE_ROUTE")
