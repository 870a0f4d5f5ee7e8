"""The Hopper grouped GEMM (src/cuda/moe_sm90.cu: wgmma, TMA, persistent tile scheduler computed
on the device) against float64 NumPy: uneven expert counts with empty experts, odd counts, tiles
that straddle experts, K not a multiple of 64, N not a multiple of the tile width, up to 1024
experts; bf16 / f16 in, f32 / bf16 / f16 out; the same bits run to run, for both tile widths,
and whatever the other experts' rows are; rows past the last expert zero in poisoned memory;
moe_mlp through it (with SwiGLU fused into the gate-up epilogue: the unfused bits), captured in a
CUDA graph and replayed with new inputs (new routing). On a device other than sm_90 the same
checks run against the mma.sync kernel. Needs a CUDA GPU."""

import ml_dtypes
import numpy as np
import pytest

import gpukit as gk

CUDA = gk.cuda.is_available()
pytestmark = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
SM90 = CUDA and tuple(gk.device_properties("cuda")["compute_capability"]) == (9, 0)
NP = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}
RNG = np.random.default_rng(9090)


def cu(a):
    return gk.asarray(a).to("cuda")


def f64(a):
    return np.asarray(gk.to_numpy(a) if isinstance(a, gk.Array) else a).astype(np.float64)


def bits(a):
    return gk.to_numpy(a).tobytes()


def make(counts, N, K, dtype, pad=0, seed=0):
    rng = np.random.default_rng(seed)
    E, R = len(counts), int(sum(counts))
    x = rng.standard_normal((R + pad, K)).astype(NP[dtype])
    w = (rng.standard_normal((E, N, K)) / np.sqrt(K)).astype(NP[dtype])
    off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return x, w, off


def reference(x, w, off):
    E = w.shape[0]
    ref, bound = np.zeros((x.shape[0], w.shape[1])), np.zeros((x.shape[0], w.shape[1]))
    for e in range(E):
        sl = slice(off[e], off[e + 1])
        if off[e + 1] > off[e]:
            ref[sl] = f64(x[sl]) @ f64(w[e]).T
            bound[sl] = np.abs(f64(x[sl])) @ np.abs(f64(w[e])).T
    return ref, bound


def check_close(g, ref, bound, K, what):
    """fp32 accumulation of exact bf16/f16 products: within a few K ulps of the sum of |terms|."""
    tol = 4 * (K + 16) * 2.0**-24 * bound
    err = np.abs(g - ref)
    bad = err > tol
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} wrong, first at {i}: got {g[i]!r}, want {ref[i]!r} "
                             f"(tol {tol[i]:.3g}); max err {err.max():.3g}, max err/bound "
                             f"{np.max(err / (bound + 1e-30)):.3g}")


def kernel_lines(capfd):
    return [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("moe_grouped_gemm:")]


CASES = [
    ([3, 0, 70, 1, 0, 300, 129, 128], 264, 200),  # empty experts, odd counts, one past a tile, K % 64 != 0
    ([0, 0, 5], 64, 128),
    ([1], 2, 8),  # the smallest shape the kernel takes
    ([257, 0, 0, 513], 520, 72),
    ([64, 65, 192, 0, 1], 256, 64),  # tiles whose second 64-row half is past the expert (idle warpgroup)
    ([70, 0, 200], 138, 64),  # N % 8 != 0: 4-byte stores instead of the 16-byte ones
    (list(RNG.integers(0, 9, 64) * (RNG.random(64) < 0.7)), 136, 64),  # 64 experts: several per lane of the scan
]


VARIANTS = {"auto": {}, "cluster2": {"GPUKIT_MOE_SM90_CLUSTER": "2"},  # pairs of CTAs sharing the w tile
            "prefetch4": {"GPUKIT_MOE_SM90_PREFETCH": "4"},  # L2 prefetch of w 4 k-blocks ahead
            "prefetch8g4": {"GPUKIT_MOE_SM90_PREFETCH": "8", "GPUKIT_MOE_SM90_PREFETCH_GROUP": "4"}}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_grouped_gemm_vs_float64(dtype, case, variant, capfd, monkeypatch):
    counts, N, K = CASES[case]
    x, w, off = make(counts, N, K, dtype, pad=3, seed=case)
    R = int(off[-1])
    monkeypatch.setenv("GPUKIT_MOE_LOG", "1")
    for var, val in VARIANTS[variant].items():
        monkeypatch.setenv(var, val)
    junk = gk.full((R + 3, N), float("nan"), dtype="float32", device="cuda")  # poison the pool
    del junk
    args = [cu(v) for v in (x, w, off)]
    y = gk.moe_grouped_gemm(*args, out_dtype="float32")
    lines = kernel_lines(capfd)
    if SM90:
        assert lines and "sm90 wgmma" in lines[-1], f"the sm90 kernel did not run: {lines}"
        assert variant != "cluster2" or "cluster=2" in lines[-1], lines
        assert variant != "prefetch4" or "prefetch=4/1" in lines[-1], lines
        assert variant != "prefetch8g4" or "prefetch=8/4" in lines[-1], lines
    ref, bound = reference(x, w, off)
    g = f64(y)
    check_close(g[:R], ref[:R], bound[:R], K, f"{dtype} counts={counts} N={N} K={K}")
    assert not g[R:].any(), f"rows past the last expert are not zero: {g[R:][np.nonzero(g[R:])][:4]}"
    assert bits(gk.moe_grouped_gemm(*args, out_dtype="float32")) == bits(y), "not the same bits run to run"
    for out in ("bfloat16", "float16"):  # the fp32 accumulators rounded once
        yo = gk.moe_grouped_gemm(*args, out_dtype=out)
        want = g.astype(np.float32).astype(NP[out])
        got = gk.to_numpy(yo)
        same = got.view(np.uint16) == want.view(np.uint16)
        assert same.all(), f"out {out}: {np.sum(~same)} differ, first at {np.argwhere(~same)[0]}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_same_bits_for_both_tile_widths_and_any_batch(dtype, capfd, monkeypatch):
    """Each output element is one CTA's chain of k16 steps: the tile width (64, 128 or 256) and the
    cluster size (1 or 2), both chosen from the shape, and the other experts' rows must not
    change a bit."""
    counts = [200, 0, 37, 300, 1, 0, 129, 90]
    N, K = 520, 328
    x, w, off = make(counts, N, K, dtype, seed=7)
    args = [cu(v) for v in (x, w, off)]
    monkeypatch.setenv("GPUKIT_MOE_LOG", "1")
    outs = {}
    for bn in ("64", "128", "256"):
        for cl in ("1", "2"):
            monkeypatch.setenv("GPUKIT_MOE_SM90_BN", bn)
            monkeypatch.setenv("GPUKIT_MOE_SM90_CLUSTER", cl)
            outs[bn, cl] = gk.to_numpy(gk.moe_grouped_gemm(*args, out_dtype="float32"))
            lines = kernel_lines(capfd)
            if SM90:
                assert lines and f"BN={bn} cluster={cl}" in lines[-1], lines
    monkeypatch.delenv("GPUKIT_MOE_SM90_BN")
    monkeypatch.delenv("GPUKIT_MOE_SM90_CLUSTER")
    ref, bound = reference(x, w, off)
    a = outs["256", "1"]
    check_close(a.astype(np.float64), ref, bound, K, "BN=256")
    for key, b in outs.items():
        diff = a.view(np.uint32) != b.view(np.uint32)
        assert not diff.any(), f"BN, cluster = {key} differs from (256, 1) at {diff.sum()} elements, " \
                               f"first {np.argwhere(diff)[0]}"
    for e in (3, 6, 4):  # one expert's rows alone (the others empty) give the same bits
        solo_off = np.array([0] * (e + 1) + [counts[e]] * (len(counts) - e), np.int32)
        xe = np.ascontiguousarray(x[off[e]:off[e + 1]])
        solo = gk.moe_grouped_gemm(cu(xe), args[1], cu(solo_off), out_dtype="float32")
        assert bits(solo) == a[off[e]:off[e + 1]].tobytes(), f"expert {e}'s rows depend on the other rows"


def test_many_experts_and_fallbacks(capfd, monkeypatch):
    """1024 experts (the most the ops take), mostly empty; K % 8 != 0 and odd N take the
    mma.sync kernel; GPUKIT_MOE_SM90=0 forces it: both within fp32 accuracy of float64."""
    monkeypatch.setenv("GPUKIT_MOE_LOG", "1")
    counts = [0] * 1024
    for e, c in [(0, 3), (31, 130), (32, 1), (500, 64), (1023, 77)]:
        counts[e] = c
    x, w, off = make(counts, 16, 32, "bfloat16", seed=3)
    ref, bound = reference(x, w, off)
    y = gk.moe_grouped_gemm(*[cu(v) for v in (x, w, off)], out_dtype="float32")
    check_close(f64(y), ref, bound, 32, "1024 experts")
    if SM90:
        assert "sm90 wgmma" in (kernel_lines(capfd) or [""])[-1]
    for counts, N, K in [([5, 0, 140], 66, 36), ([5, 0, 140], 65, 64)]:  # K % 8, odd N: mma.sync / CUDA cores
        x, w, off = make(counts, N, K, "bfloat16", seed=4)
        ref, bound = reference(x, w, off)
        check_close(f64(gk.moe_grouped_gemm(*[cu(v) for v in (x, w, off)], out_dtype="float32")), ref, bound, K,
                    f"fallback N={N} K={K}")
        assert not kernel_lines(capfd), "the sm90 kernel took a shape it does not support"
    counts, N, K = [100, 0, 300, 7], 264, 136
    x, w, off = make(counts, N, K, "bfloat16", seed=5)
    args = [cu(v) for v in (x, w, off)]
    ref, bound = reference(x, w, off)
    monkeypatch.setenv("GPUKIT_MOE_SM90", "0")
    old = gk.moe_grouped_gemm(*args, out_dtype="float32")
    assert not kernel_lines(capfd)
    monkeypatch.delenv("GPUKIT_MOE_SM90")
    new = gk.moe_grouped_gemm(*args, out_dtype="float32")
    check_close(f64(old), ref, bound, K, "mma.sync")
    check_close(f64(new), ref, bound, K, "sm90")
    print(f"sm90 vs mma.sync: {'bitwise equal' if bits(old) == bits(new) else 'differ in rounding'}")


def test_grouped_gemm_graph_new_offsets():
    """validate=False: no host copy of the offsets, so the call can be captured; replays after new
    offsets were copied into the captured array schedule the new expert split on the device."""
    N, K = 264, 136
    splits = [[100, 0, 37, 200], [0, 300, 30, 7], [337, 0, 0, 0], [0, 0, 0, 330]]  # the last: 7 rows past the end
    x, w, off0 = make(splits[0], N, K, "bfloat16", seed=8)
    xa, wa, offa = cu(x), cu(w), cu(off0)
    g = gk.Graph(gk.Stream("cuda"))
    with g.stream:
        gk.moe_grouped_gemm(xa, wa, offa, out_dtype="float32", validate=False)
    g.stream.synchronize()
    with g:
        y = gk.moe_grouped_gemm(xa, wa, offa, out_dtype="float32", validate=False)
    for counts in splits:
        off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        src = cu(off)
        gk.cuda.synchronize()
        gk.copy_into(offa, src, stream=g.stream)
        g.replay()
        g.stream.synchronize()
        eager = gk.moe_grouped_gemm(xa, wa, cu(off), out_dtype="float32")
        assert bits(y) == bits(eager), f"replay with offsets {off.tolist()} != eager"
        ref, bound = reference(x, w, off)
        check_close(f64(y), ref, bound, K, f"replay, offsets {off.tolist()}")


def mlp_ref(x, gate_w, w13, w2, k):
    X = f64(x)
    lg = X @ f64(gate_w).T
    ids = np.argsort(-lg, axis=1, kind="stable")[:, :k]
    p = np.exp(lg - lg.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    wts = np.take_along_axis(p, ids, 1)
    wts /= wts.sum(1, keepdims=True)
    I = w13.shape[1] // 2
    out = np.zeros_like(X)
    for e in range(w13.shape[0]):
        t, j = np.nonzero(ids == e)
        if len(t) == 0:
            continue
        h = X[t] @ f64(w13[e]).T
        g, u = h[:, :I], h[:, I:]
        out[t] += wts[t, j][:, None] * ((g / (1 + np.exp(-g)) * u) @ f64(w2[e]).T)
    return out


def test_moe_mlp_graph_replay_new_routing():
    """moe_mlp (router, gating, permute, two grouped GEMMs, SwiGLU, un-permute) captured in a CUDA
    graph: nothing reads the offsets on the host, so a replay after new inputs were copied into
    the captured x routes them anew and gives the eager result bit for bit."""
    T, H, I, E, k = 333, 256, 384, 8, 2
    rng = np.random.default_rng(11)
    dt = ml_dtypes.bfloat16
    x0 = rng.standard_normal((T, H)).astype(dt)
    x1 = rng.standard_normal((T, H)).astype(dt)
    gate_w = (rng.standard_normal((E, H)) / np.sqrt(H)).astype(dt)
    w13 = (rng.standard_normal((E, 2 * I, H)) / np.sqrt(H)).astype(dt)
    w2 = (rng.standard_normal((E, H, I)) / np.sqrt(I)).astype(dt)
    gw, a13, a2 = cu(gate_w), cu(w13), cu(w2)
    s = gk.Stream("cuda")
    with s:
        eager0 = gk.moe_mlp(cu(x0), gw, a13, a2, k)
        eager1 = gk.moe_mlp(cu(x1), gw, a13, a2, k)
    s.synchronize()
    ref = mlp_ref(x1, gate_w, w13, w2, k)
    err = np.max(np.abs(f64(eager1) - ref)) / np.max(np.abs(ref))
    assert err < 3e-2, f"moe_mlp vs float64: relative error {err:.3g}"
    g = gk.Graph(gk.Stream("cuda"))
    xg = cu(x0)
    with g.stream:  # warm-up on the capture stream (router GEMM plan, workspace)
        gk.moe_mlp(xg, gw, a13, a2, k)
    g.stream.synchronize()
    with g:
        yg = gk.moe_mlp(xg, gw, a13, a2, k)
    g.replay()
    g.stream.synchronize()
    assert bits(yg) == bits(eager0), "graph replay != eager"
    src = cu(x1)
    gk.cuda.synchronize()
    gk.copy_into(xg, src, stream=g.stream)
    g.replay()
    g.stream.synchronize()
    assert bits(yg) == bits(eager1), "replay with new inputs != eager (routing read on the host at capture?)"


def test_unvalidated_bad_offsets_stay_in_bounds():
    """validate=False with offsets that are not a split of the rows: wrong rows at worst, no fault."""
    x, w, _ = make([10, 10, 10], 64, 64, "bfloat16")
    for off in ([0, 500, 2, 9999], [-5, 3, -100, 30], [7, 7, 7, 7], [0, 30, 0, 30]):
        y = gk.moe_grouped_gemm(cu(x), cu(w), cu(np.array(off, np.int32)), out_dtype="float32", validate=False)
        gk.cuda.synchronize()
        assert y.shape == (30, 64)
    assert not gk.cuda.is_failed()


@pytest.mark.parametrize("cluster", ["1", "2", "bn64"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("T,H,I", [(333, 256, 384), (50, 136, 200), (19, 64, 102), (7, 64, 101)])
def test_moe_mlp_fused_swiglu_same_bits(dtype, T, H, I, cluster, capfd, monkeypatch):
    """moe_mlp's gate-up product with SwiGLU in the kernel's epilogue (Hopper; I even) gives the
    bits of the product to fp32 followed by the separate epilogue (GPUKIT_MOE_FUSED_SWIGLU=0)."""
    E, k = 8, 2
    rng = np.random.default_rng(T + I)
    dt = NP[dtype]
    x = rng.standard_normal((T, H)).astype(dt)
    gate_w = (rng.standard_normal((E, H)) / np.sqrt(H)).astype(dt)
    w13 = (rng.standard_normal((E, 2 * I, H)) / np.sqrt(H)).astype(dt)
    w2 = (rng.standard_normal((E, H, I)) / np.sqrt(I)).astype(dt)
    args = [cu(v) for v in (x, gate_w, w13, w2)]
    monkeypatch.setenv("GPUKIT_MOE_LOG", "1")
    if cluster == "bn64":
        monkeypatch.setenv("GPUKIT_MOE_SM90_BN", "64")
    else:
        monkeypatch.setenv("GPUKIT_MOE_SM90_CLUSTER", cluster)
    fused = gk.moe_mlp(*args, k)
    lines = kernel_lines(capfd)
    if SM90:
        assert any("(swiglu)" in ln for ln in lines) == (I % 2 == 0), lines
    monkeypatch.setenv("GPUKIT_MOE_FUSED_SWIGLU", "0")
    apart = gk.moe_mlp(*args, k)
    assert not any("(swiglu)" in ln for ln in kernel_lines(capfd))
    a, b = gk.to_numpy(fused).view(np.uint16), gk.to_numpy(apart).view(np.uint16)
    assert (a == b).all(), f"fused != unfused at {np.sum(a != b)} elements, first {np.argwhere(a != b)[0]}"
    ref = mlp_ref(x, gate_w, w13, w2, k)
    err = np.max(np.abs(f64(fused) - ref)) / np.max(np.abs(ref))
    assert err < 3e-2, f"moe_mlp vs float64: relative error {err:.3g}"
