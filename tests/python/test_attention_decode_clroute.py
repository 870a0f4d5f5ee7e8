"""attention_decode, session 8's candidate route bits for batches of short caches (src/cuda/attention_decode.cu):
8192 sends B >= 2 with 2..16 groups per sequence in at most two waves of CTA group units (B4 / B6 / B8 T1024,
B16 T512) to the cluster kernel with two groups per CTA (25) where all its clusters are resident, 16384 to the
cluster kernel of 4-warp CTAs (33, no PDL). No workspace, no cross-CTA merge in global memory. Each must take the
path it names (GPUKIT_DECODE_LOG) and give the common bits of the fold kernels (23, and 38: the default there),
within the float64 reference, on poisoned allocations, contiguous and paged, with per-sequence odd lengths (0, 1,
17, 257, ...), alone in its batch, in a PDL chain and in a replayed graph."""
import numpy as np
import pytest

import gpukit as gk
from decode_chain import chain_outs, check_chain, run_logged
from test_attention import TOL, f64, make
from test_attention_decode import bits, check, gpu, ref_decode, setup_compact

Hq, Hkv = 32, 8
DEFAULT = 4665  # session 8's checkpoint A default (1 | 8 | 16 | 32 | 512 | 4096); the final default adds both bits


def _lens(B, T, seed):
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, T + 1, B).astype(np.int32)
    fixed = [T, 0, 17, 1, T - 1, 257, 255, 33]  # full, empty, odd, one key, one group + 1, a group - 1
    lens[:min(B, len(fixed))] = fixed[:B]
    return lens


def _data(B, T, D, dtype, paged, seed):
    return _case(B, T, D, dtype, paged, _lens(B, T, seed), seed)


# q, the caches (contiguous, or shuffled 16-row pages with a block table padded with -1) for given lengths
def _case(B, T, D, dtype, paged, lens, seed):
    lens = np.asarray(lens, np.int32)
    if paged:  # shuffled 16-row blocks, tables padded with -1
        q, kc, vc, bt = setup_compact(lens, Hq, Hkv, D, 16, dtype, seed=seed)
    else:
        kc = make((B, T, Hkv, D), dtype, seed + 1)
        vc = make((B, T, Hkv, D), dtype, seed + 2)
        q = make((B, Hq, D), dtype, seed + 3)
        bt = None
    return q, kc, vc, lens, bt


def _call(qd, kd, vd, ld, btd):
    return gk.nn.attention_decode(qd, kd, vd, ld, block_table=btd) if btd is not None else \
        gk.nn.attention_decode(qd, kd, vd, ld)


@gpu
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("B,T,D,dtype", [(16, 512, 128, "bfloat16"), (8, 1024, 128, "bfloat16"),
                                         (4, 1024, 64, "float16"), (6, 1000, 128, "float16")])
@pytest.mark.parametrize("bit,path", [(8192, "two groups per CTA (25)"), (16384, "cluster of 4-warp CTAs (33)")])
def test_cuda_cluster_route_batch(B, T, D, dtype, paged, bit, path, monkeypatch, capfd):
    q, kc, vc, lens, bt = _data(B, T, D, dtype, paged, 900 + B + D + (50 if paged else 0))
    kd, vd, ld, qd = (gk.asarray(x).to("cuda") for x in (kc, vc, lens, q))
    btd = gk.asarray(bt).to("cuda") if paged else None
    monkeypatch.delenv("GPUKIT_DECODE_ROUTE", raising=False)
    want = {}
    for v in ("23", "38"):
        monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128," + v)
        want[v] = bits(_call(qd, kd, vd, ld, btd))
    d = np.argwhere(want["38"] != want["23"])
    assert d.size == 0, f"38 differs from 23 at {d[0]} (B={B} T={T} D={D} paged={paged})"
    monkeypatch.delenv("GPUKIT_DECODE_SPLIT")
    route = DEFAULT | bit
    if bit == 16384 and B == 8:  # 33's 64 clusters of 4 CTAs: 62 resident on an H200, so 38 runs (s8 final run)
        path = "tagged merge (38)"
    monkeypatch.setenv("GPUKIT_DECODE_ROUTE", str(route))
    capfd.readouterr()
    monkeypatch.setenv("GPUKIT_DECODE_LOG", "1")
    gk._C._debug_check_guards()  # clear what earlier code left
    gk._C._debug_alloc_poison(0xFF)  # outputs (and any workspace) start as NaN: every element must be written
    try:
        got = _call(qd, kd, vd, ld, btd)
        gk.cuda.synchronize()
    finally:
        gk._C._debug_alloc_poison(-1)
    violations = gk._C._debug_check_guards()
    log = capfd.readouterr().err
    monkeypatch.delenv("GPUKIT_DECODE_LOG")
    assert not violations, violations
    assert path in log, f"route {route} at B={B} T={T} D={D} paged={paged} did not take {path}: {log!r}"
    d = np.argwhere(bits(got) != want["23"])
    assert d.size == 0, (f"route {route} ({path}) differs from 23 at {d[0]} of {d.shape[0]} "
                         f"(B={B} T={T} D={D} paged={paged}, lengths {lens.tolist()})")
    check(got, ref_decode(f64(q), f64(kc), f64(vc), lens, bt), TOL[dtype] * 2,
          f"route {route} B={B} T={T} D={D} paged={paged}")
    for i in (0, 2, B - 1):  # alone in its batch (a one-sequence call takes another path)
        alone = _call(qd[i:i + 1], kd if paged else kd[i:i + 1], vd if paged else vd[i:i + 1], ld[i:i + 1],
                      btd[i:i + 1] if paged else None)
        np.testing.assert_array_equal(bits(alone)[0], want["23"][i], err_msg=f"sequence {i} alone, route {route}")
    # a graph (the route is read at capture time) replayed between eager calls of other lengths
    other = gk.asarray((lens // 3).astype(np.int32)).to("cuda")  # (shorter: within each block table too)
    g = gk.Graph()
    with g:
        out = _call(qd, kd, vd, ld, btd)
    for _ in range(2):
        g.replay()
        e = _call(qd, kd, vd, other, btd)
        gk.cuda.synchronize()
        np.testing.assert_array_equal(bits(out), want["23"], err_msg=f"graph replay, route {route}")
        assert np.all(np.isfinite(f64(e))), "eager call between replays"


@gpu
@pytest.mark.parametrize("bit", [8192, 16384])
def test_cuda_cluster_route_chain(bit, monkeypatch, capfd):
    # a PDL chain out_{i+1} = decode(q = out_i) at B16 T512 on poisoned allocations (a read before the write gives
    # NaN), within the float64 reference step by step and equal to 23's chain; PDL off equal too
    B, T, D, dtype = 16, 512, 128, "bfloat16"
    q, kc, vc, lens, _ = _data(B, T, D, dtype, False, 990)
    kd, vd, ld, qd = (gk.asarray(x).to("cuda") for x in (kc, vc, lens, q))
    kk, vv = f64(kc), f64(vc)

    def chain(n):
        return chain_outs(qd, kd, vd, ld, n)

    monkeypatch.delenv("GPUKIT_DECODE_ROUTE", raising=False)
    monkeypatch.setenv("GPUKIT_DECODE_SPLIT", "32,1024,128,23")
    base = [bits(o) for o in chain(3)]
    monkeypatch.delenv("GPUKIT_DECODE_SPLIT")
    monkeypatch.setenv("GPUKIT_DECODE_ROUTE", str(DEFAULT | bit))
    poisoned, log = run_logged(lambda: chain(3), monkeypatch, capfd)
    assert ("(25)" if bit == 8192 else "(33)") in log, f"bit {bit} did not take its path: {log!r}"
    check_chain(poisoned, q, kk, vv, lens, base, f"bit {bit} chain", "23")
    monkeypatch.setenv("GPUKIT_DECODE_PDL", "0")
    for i, o in enumerate(chain(3)):
        np.testing.assert_array_equal(bits(o), base[i], err_msg=f"bit {bit} PDL off step {i}")
    monkeypatch.delenv("GPUKIT_DECODE_PDL")

