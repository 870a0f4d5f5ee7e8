"""attention_decode variant 39 (src/cuda/attention_decode_fold_c2.cu, session 9): 33's 4-warp CTAs with two groups
each, in clusters half as large (B2 / B3 T4096: clusters of 8 CTAs on 4 SMs, all resident), the groups folded
through distributed shared memory; route bit 131072 (off) sends B >= 2 with 2..16 groups in <= 3 waves of CTA group
units to it where all its clusters are resident (after 33 / 25), 262144 launches that without PDL.
It must take the path it names (GPUKIT_DECODE_LOG), give the fold kernels' common bits (23), stay within the float64
reference, write every output (poisoned allocations), read nothing out of bounds (guards), for contiguous and paged
caches, odd / empty / one-key lengths, alone in its batch, in a replayed graph and in a PDL chain."""
import pathlib
import re

import numpy as np
import pytest

import gpukit as gk
from test_attention import TOL, f64, make
from test_attention_decode import bits, check, gpu, ref_decode, setup_compact
from test_attention_decode_clroute import _case as _data

Hq, Hkv = 32, 8
DEFAULT = 62011  # session 9's kRouteDefault
BIT, NOPDL = 131072, 262144
ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_variant39_and_route_bits_accepted_cpu(monkeypatch):
    # the variant bound (src/ops/attention.cpp) and the dispatcher's fallback range (23 where 39 does not run) take
    # 39; the CPU path ignores the override and the route bits (same result, float64 reference)
    src = (ROOT / "src/ops/attention.cpp").read_text()
    m = re.search(r"constexpr int kMaxVariant = (\d+);", src)
    assert m and int(m.group(1)) >= 39, "kMaxVariant must accept variant 39"
    disp = (ROOT / "src/cuda/attention_decode.cu").read_text()
    m = re.search(r"v >= 14 && v <= (\d+) && v != 16", disp)
    assert m and int(m.group(1)) >= 39, "the fallback to 23 must cover variant 39"
    assert "attention_decode_fold_c2(a, st, true" in disp and "(route & 131072)" in disp
    bench = (ROOT / "bench/attention.py").read_text()
    assert "39:" in bench and "131072" in bench, "bench/attention.py's --splits help names 39 and its bits"
    B, T, D = 3, 40, 64
    q, kc, vc = make((B, Hq, D), "float32", 1), make((B, T, Hkv, D), "float32", 2), make((B, T, Hkv, D), "float32", 3)
    lens = np.array([T, 0, 17], np.int32)
    monkeypatch.delenv("GPUKIT_DECODE_ROUTE", raising=False)
    monkeypatch.delenv("GPUKIT_DECODE_SPLIT", raising=False)
    want = gk.to_numpy(gk.nn.attention_decode(gk.asarray(q), gk.asarray(kc), gk.asarray(vc), gk.asarray(lens)))
    for env in ({"GPUKIT_DECODE_SPLIT": "32,1024,128,39"}, {"GPUKIT_DECODE_ROUTE": str(DEFAULT | BIT)},
                {"GPUKIT_DECODE_ROUTE": str(DEFAULT | BIT | NOPDL)}):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        got = gk.to_numpy(gk.nn.attention_decode(gk.asarray(q), gk.asarray(kc), gk.asarray(vc), gk.asarray(lens)))
        for k in env:
            monkeypatch.delenv(k)
        np.testing.assert_array_equal(got, want, err_msg=f"{env}")
    check(want, ref_decode(f64(q), f64(kc), f64(vc), lens), 1e-5, "cpu")


def _call(qd, kd, vd, ld, btd, **kw):
    return gk.nn.attention_decode(qd, kd, vd, ld, block_table=btd, **kw) if btd is not None else \
        gk.nn.attention_decode(qd, kd, vd, ld, **kw)


def _logged(fn, monkeypatch, capfd):
    capfd.readouterr()
    monkeypatch.setenv("GPUKIT_DECODE_LOG", "1")
    gk._C._debug_check_guards()  # clear what earlier code left
    gk._C._debug_alloc_poison(0xFF)  # outputs start as NaN: every element must be written
    try:
        out = fn()
        gk.cuda.synchronize()
    finally:
        gk._C._debug_alloc_poison(-1)
    violations = gk._C._debug_check_guards()
    log = capfd.readouterr().err
    monkeypatch.delenv("GPUKIT_DECODE_LOG")
    assert not violations, violations
    return out, log


def _fixed(B, T):
    # full, empty, one key, odd, a group + 1 chunk, a partial last group, then random
    f = {2: [T, T // 2 + 1], 3: [T - 1, 0, T // 2 + 257]}.get(B, [T, 0, 17, 1, T - 1, 257, 255, 33])
    rng = np.random.default_rng(B * 7 + T)
    lens = list(rng.integers(1, T + 1, B))
    lens[:min(B, len(f))] = f[:B]
    return lens


# (B, T, D, dtype): ngmax 16 (clusters of 8; B2 / B3 T4096: the target shapes; T4000: a capacity that is not a
# power of two), 8 (clusters of 4), 4 (clusters of 2), 2 (one CTA, both groups in it)
CASES = [(2, 4096, 128, "bfloat16"), (3, 4096, 128, "bfloat16"), (2, 4000, 64, "float16"), (3, 2048, 64, "bfloat16"),
         (5, 1000, 128, "float16"), (16, 512, 128, "bfloat16")]


@gpu
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("B,T,D,dtype", CASES)
@pytest.mark.parametrize("how", ["forced", "route", "route_nopdl"])
def test_cuda_c2(B, T, D, dtype, paged, how, monkeypatch, capfd):
    if how != "forced" and T != 4096:
        pytest.skip("the route is tested at its target shapes (B2 / B3 T4096; elsewhere 33 / 25 come first)")
    lens = _fixed(B, T)
    q, kc, vc, lens, bt = _data(B, T, D, dtype, paged, lens, 1200 + B + D + (50 if paged else 0))
    kd, vd, ld, qd = (gk.asarray(x).to("cuda") for x in (kc, vc, lens, q))
    btd = gk.asarray(bt).to("cuda") if paged else None
    monkeypatch.delenv("GPUKIT_DECODE_ROUTE", raising=False)
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128,23")
    want = bits(_call(qd, kd, vd, ld, btd))
    monkeypatch.delenv("GPUKIT_DECODE_SPLIT")
    path = "two groups per CTA (39)"
    if how == "forced":
        monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128,39")
    else:
        monkeypatch.setenv("GPUKIT_DECODE_ROUTE", str(DEFAULT | BIT | (NOPDL if how == "route_nopdl" else 0)))
        if how == "route_nopdl":
            path += ", no PDL"
    what = f"{how} B={B} T={T} D={D} {dtype} paged={paged}"
    got, log = _logged(lambda: _call(qd, kd, vd, ld, btd), monkeypatch, capfd)
    assert path in log, f"{what} did not take {path}: {log!r}"
    d = np.argwhere(bits(got) != want)
    assert d.size == 0, f"{what}: differs from 23 at {d[0]} of {d.shape[0]} (lengths {lens.tolist()})"
    check(got, ref_decode(f64(q), f64(kc), f64(vc), lens, bt), TOL[dtype] * 2, what)
    again = _call(qd, kd, vd, ld, btd)
    np.testing.assert_array_equal(bits(again), want, err_msg=f"{what}: run to run")
    for i in sorted({0, 1, B - 1}):  # alone in its batch (route: another path at B = 1; forced: 39 again)
        alone = _call(qd[i:i + 1], kd if paged else kd[i:i + 1], vd if paged else vd[i:i + 1], ld[i:i + 1],
                      btd[i:i + 1] if paged else None)
        np.testing.assert_array_equal(bits(alone)[0], want[i], err_msg=f"{what}: sequence {i} alone")
    # a graph (the route / variant is read at capture time) replayed between eager calls of other lengths
    other = gk.asarray((lens // 3).astype(np.int32)).to("cuda")
    g = gk.Graph()
    with g:
        out = _call(qd, kd, vd, ld, btd)
    for _ in range(2):
        g.replay()
        e = _call(qd, kd, vd, other, btd)
        gk.cuda.synchronize()
        np.testing.assert_array_equal(bits(out), want, err_msg=f"{what}: graph replay")
        assert np.all(np.isfinite(f64(e))), f"{what}: eager call between replays"


@gpu
@pytest.mark.parametrize("kw", [{"window": 100, "softcap": 3.0}, {"window": 2100}, {"window": 1}])
def test_cuda_c2_window_softcap(kw, monkeypatch, capfd):
    # windows cut the attended keys (the chunking follows the window's length), soft-cap on the logits
    B, T, D, dtype = 3, 4096, 128, "bfloat16"
    q, kc, vc, lens, bt = _data(B, T, D, dtype, True, [4096, 2101, 1], 1300)
    kd, vd, ld, qd, btd = (gk.asarray(x).to("cuda") for x in (kc, vc, lens, q, bt))
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128,23")
    want = bits(_call(qd, kd, vd, ld, btd, **kw))
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128,39")
    got, log = _logged(lambda: _call(qd, kd, vd, ld, btd, **kw), monkeypatch, capfd)
    assert "(39)" in log, log
    np.testing.assert_array_equal(bits(got), want, err_msg=f"39 {kw}")
    check(got, ref_decode(f64(q), f64(kc), f64(vc), lens, bt, **kw), TOL[dtype] * 2, f"39 {kw}")


@gpu
def test_cuda_c2_not_covered_falls_back(monkeypatch, capfd):
    # more than 16 groups per sequence (256 chunks): 39 does not run, 23 does (the same bits as forced 23)
    B, T, D, dtype = 2, 8192, 128, "bfloat16"
    q, kc, vc, lens, bt = _data(B, T, D, dtype, False, [8192, 4097], 1400)
    kd, vd, ld, qd = (gk.asarray(x).to("cuda") for x in (kc, vc, lens, q))
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,256,23")
    want = bits(_call(qd, kd, vd, ld, None))
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,256,39")
    got, log = _logged(lambda: _call(qd, kd, vd, ld, None), monkeypatch, capfd)
    assert "(23)" in log and "(39)" not in log, log
    np.testing.assert_array_equal(bits(got), want)


@gpu
@pytest.mark.parametrize("how", ["forced", "route_nopdl"])
def test_cuda_c2_chain(how, monkeypatch, capfd):
    # a PDL chain out_{i+1} = decode(q = out_i) at B2 T4096 on poisoned allocations (a read before the write gives
    # NaN), within the float64 reference step by step and equal to 23's chain; PDL off equal too
    B, T, D, dtype = 2, 4096, 128, "bfloat16"
    q, kc, vc, lens, _ = _data(B, T, D, dtype, False, [4096, 3001], 1500)
    kd, vd, ld, qd = (gk.asarray(x).to("cuda") for x in (kc, vc, lens, q))
    kk, vv = f64(kc), f64(vc)

    def chain(n):
        outs, x = [], qd
        for _ in range(n):
            x = gk.nn.attention_decode(x, kd, vd, ld)
            outs.append(x)
        return outs

    monkeypatch.delenv("GPUKIT_DECODE_ROUTE", raising=False)
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128,23")
    base = [bits(o) for o in chain(3)]
    monkeypatch.delenv("GPUKIT_DECODE_SPLIT")
    if how == "forced":
        monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128,39")
    else:
        monkeypatch.setenv("GPUKIT_DECODE_ROUTE", str(DEFAULT | BIT | NOPDL))
    poisoned, log = _logged(lambda: chain(3), monkeypatch, capfd)
    assert log.count("(39)") == 3, f"{how}: not every step took 39: {log!r}"
    prev = f64(q)
    for i, o in enumerate(poisoned):
        check(o, ref_decode(prev, kk, vv, lens), 3.2e-2, f"{how} chain step {i}")
        prev = f64(o)
        d = np.argwhere(bits(o) != base[i])
        assert d.size == 0, f"{how} chain step {i} differs from 23 at {d[0]}"
    monkeypatch.setenv("GPUKIT_DECODE_PDL", "0")
    for i, o in enumerate(chain(3)):
        np.testing.assert_array_equal(bits(o), base[i], err_msg=f"{how} PDL off step {i}")
    monkeypatch.delenv("GPUKIT_DECODE_PDL")


@gpu
@pytest.mark.parametrize("B,T", [(16, 512), (8, 1024), (4, 1024), (1, 4096)])
def test_cuda_c2_route_elsewhere_unchanged(B, T, monkeypatch, capfd):
    # where 33 / 25 (bits 16384 / 8192) run, or at B = 1, bit 131072 changes nothing: the same path as 62011, the
    # same bits
    D, dtype = 128, "bfloat16"
    q, kc, vc, lens, _ = _data(B, T, D, dtype, False, _fixed(B, T) if B > 1 else [T - 3], 1600 + B)
    kd, vd, ld, qd = (gk.asarray(x).to("cuda") for x in (kc, vc, lens, q))
    monkeypatch.delenv("GPUKIT_DECODE_SPLIT", raising=False)
    res = {}
    for route in (DEFAULT, DEFAULT | BIT, DEFAULT | BIT | NOPDL):
        monkeypatch.setenv("GPUKIT_DECODE_ROUTE", str(route))
        got, log = _logged(lambda: _call(qd, kd, vd, ld, None), monkeypatch, capfd)
        m = re.search(r"route \d+: (.*)", log)
        assert m, log
        res[route] = (m.group(1).strip(), bits(got))
    for route in (DEFAULT | BIT, DEFAULT | BIT | NOPDL):
        assert res[route][0] == res[DEFAULT][0], f"B={B} T={T}: route {route} took {res[route][0]}"
        np.testing.assert_array_equal(res[route][1], res[DEFAULT][1], err_msg=f"B={B} T={T} route {route}")
