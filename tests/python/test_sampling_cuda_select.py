"""The fused decode step's threshold selects (src/cuda/common/sampling_cluster.cuh) under
their development knobs: the early stop at a bin kept whole (GPUKIT_SAMPLING_EARLY), the
relative-exp cache (GPUKIT_SAMPLING_CACHE), the compacted deeper levels
(GPUKIT_SAMPLING_COMPACT) and the cluster shape (GPUKIT_SAMPLING_CLUSTER / _THREADS,
7-CTA clusters included) change the speed only: tokens and logprob bits must
be the same as the default and as the CPU reference, also on rows built to stop the
selects at each level (ties across the top-k boundary, one dominant token, 1-ulp steps).
GPU machines only."""
import os

import numpy as np
import pytest

import gpukit as gk
from harness import to_cuda as C, to_host as H, to_np as N

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA device")
S = gk.sampling

KNOBS = ("GPUKIT_SAMPLING_EARLY", "GPUKIT_SAMPLING_CLUSTER", "GPUKIT_SAMPLING_THREADS", "GPUKIT_SAMPLING_CACHE",
         "GPUKIT_SAMPLING_COMPACT", "GPUKIT_SAMPLING_FUSED")
SETTINGS = [{}, {"GPUKIT_SAMPLING_EARLY": "0"}, {"GPUKIT_SAMPLING_COMPACT": "0"},
            {"GPUKIT_SAMPLING_EARLY": "0", "GPUKIT_SAMPLING_COMPACT": "0"},
            {"GPUKIT_SAMPLING_CACHE": "0"}, {"GPUKIT_SAMPLING_CACHE": "1"},
            {"GPUKIT_SAMPLING_CLUSTER": "4", "GPUKIT_SAMPLING_THREADS": "1024"},
            {"GPUKIT_SAMPLING_CLUSTER": "7", "GPUKIT_SAMPLING_THREADS": "512"},
            {"GPUKIT_SAMPLING_CLUSTER": "8", "GPUKIT_SAMPLING_THREADS": "512"},
            {"GPUKIT_SAMPLING_CLUSTER": "16", "GPUKIT_SAMPLING_THREADS": "1024"}]


def _with(env, fn):
    old = {k: os.environ.get(k) for k in KNOBS}
    try:
        for k in KNOBS:
            os.environ.pop(k, None)
        os.environ.update(env)
        return fn()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _edge_rows(V, g):
    """Rows whose selects end at different levels and on ties."""
    rows = []
    x = (g.standard_normal(V) * 4).astype(np.float32)
    rows.append(x)                                   # peaked
    rows.append((g.standard_normal(V) * 0.02).astype(np.float32))  # flat
    x = np.round(g.standard_normal(V) * 2).astype(np.float32)       # many ties (integers)
    rows.append(x)
    x = np.full(V, 1.0, np.float32)                  # ties across the top-k boundary: 30 above, the rest tied
    x[g.choice(V, 30, replace=False)] = 2.0
    rows.append(x)
    x = (g.standard_normal(V) * 0.5).astype(np.float32)  # one dominant token
    x[g.integers(V)] = 40.0
    rows.append(x)
    base = np.float32(3.0)                            # 1-ulp steps at the top: bins split in the last level
    x = (g.standard_normal(V) - 6).astype(np.float32)
    idx = g.choice(V, 64, replace=False)
    x[idx] = base
    x[idx[::2]] = np.nextafter(base, np.float32(10))
    x[idx[::4]] = np.nextafter(np.nextafter(base, np.float32(10)), np.float32(10))
    rows.append(x.astype(np.float32))
    x = np.zeros(V, np.float32)                       # all equal
    rows.append(x)
    return np.stack(rows)


def _params(B, L, g):
    T = g.choice([0.5, 0.8, 1.0, 1.3], size=B).astype(np.float32)
    K = g.choice([0, 1, 30, 31, 50, 64, 1000], size=B).astype(np.int32)
    P = g.choice([1.0, 0.3, 0.9, 0.95, 0.999], size=B).astype(np.float32)
    MP = g.choice([0.0, 0.0, 0.05], size=B).astype(np.float32)
    return dict(temperature=L(T), top_k=L(K), top_p=L(P), min_p=L(MP))


@pytest.mark.parametrize("V", [128256, 151936])
def test_select_knobs_same_bits_and_cpu(V):
    g = np.random.default_rng(V + 5)
    x = _edge_rows(V, g)
    x = np.concatenate([x, x[::-1] * np.float32(0.7)])
    B = x.shape[0]
    xc = C(x)
    n_pos = 4
    seeds = np.arange(B, dtype=np.int64) * 7 + 1
    pg = np.random.default_rng(3)
    prm_np = [_params(B, np.asarray, pg) for _ in range(2)]

    def run_all(L, xin):
        out = []
        for pk in prm_np:
            p = S.Params(**{k: L(v) for k, v in pk.items()})
            for pos in range(n_pos):
                r = S.decode_step(xin, p, L(seeds), L(np.full(B, pos, np.int64)), return_logprobs=True)
                out.append((N(r.tokens).copy(), N(r.logprobs).view(np.uint32).copy(), N(r.logprobs).copy()))
        return out

    ref = _with({}, lambda: run_all(C, xc))
    cpu = run_all(H, H(x))
    bad = 0
    for j, ((tc, _, lc), (th, _, lh)) in enumerate(zip(ref, cpu)):
        d = np.nonzero(tc != th)[0]
        if len(d):
            r = d[0]
            print(f"cuda vs cpu call {j}: {len(d)} rows differ; row {r}: cuda {tc[r]} cpu {th[r]}")
            bad += len(d)
        ok = np.isfinite(lh)
        np.testing.assert_allclose(lc[ok], lh[ok], rtol=1e-5, atol=1e-5)
    assert bad == 0
    for env in SETTINGS[1:]:
        got = _with(env, lambda: run_all(C, xc))
        for j, ((ta, la, _), (tb, lb, _)) in enumerate(zip(ref, got)):
            d = np.nonzero((ta != tb) | (la != lb))[0]
            assert len(d) == 0, f"{env} call {j}: rows {d.tolist()} differ: default {ta[d]} vs {tb[d]}"


def test_select_knobs_batch_of_32_bits():
    """B = 32 takes the 8-CTA shape: same bits under every knob, and row by row."""
    V = 151936
    g = np.random.default_rng(77)
    e = _edge_rows(V, g)
    x = np.concatenate([e] * 5)[:32] * np.float32(1.1)
    B = 32
    pk = _params(B, np.asarray, np.random.default_rng(8))
    seeds = np.arange(B, dtype=np.int64) + 40

    def run(xin, sl=slice(None)):
        p = S.Params(**{k: C(v[sl]) for k, v in pk.items()})
        r = S.decode_step(xin, p, C(seeds[sl]), C(np.full(len(seeds[sl]), 3, np.int64)), return_logprobs=True)
        return N(r.tokens).copy(), N(r.logprobs).view(np.uint32).copy()
    xc = C(x)
    t0, l0 = _with({}, lambda: run(xc))
    for env in SETTINGS[1:]:
        t1, l1 = _with(env, lambda: run(xc))
        d = np.nonzero((t0 != t1) | (l0 != l1))[0]
        assert len(d) == 0, f"{env}: rows {d.tolist()} differ"
    for env in ({}, {"GPUKIT_SAMPLING_FUSED": "1"}, {"GPUKIT_SAMPLING_FUSED": "0"}):  # one row: by shape / forced
        for r in (0, 3, 6, 13, 31):
            t1, l1 = _with(env, lambda: run(C(x[r:r + 1]), slice(r, r + 1)))
            assert t1[0] == t0[r] and l1[0] == l0[r], f"{env} row {r} alone {t1[0]} vs in batch {t0[r]}"
    t1, l1 = _with({"GPUKIT_SAMPLING_FUSED": "0"}, lambda: run(xc))  # the whole batch on the multi-pass path
    d = np.nonzero((t0 != t1) | (l0 != l1))[0]
    assert len(d) == 0, f"multi-pass vs fused: rows {d.tolist()} differ"
