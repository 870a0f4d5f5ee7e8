"""The one-launch cluster path of decode_step / sample (src/cuda/sampling_fused.cu) on CUDA:
every processor and filter it takes (no typical-p, no top-n) against the CPU reference,
against the multi-pass path (forced by a typical_p array of ones: same tokens and logprob
bits), batch invariance across cluster sizes (B <= 4 and B > 4 use different partitions),
unaligned rows, graph replay, bad rows. GPU machines only."""
import numpy as np
import pytest

import gpukit as gk

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA device")
S = gk.sampling


from harness import to_cuda as C, to_host as H, to_np as N  # noqa: E402


def _diff(name, a, b, extra=None):
    a, b = np.asarray(a), np.asarray(b)
    bad = np.argwhere(a != b)
    if len(bad):
        i = tuple(bad[0])
        msg = f"{name}: {len(bad)} of {a.size} differ; first at {i}: cuda {a[i]} cpu {b[i]}"
        if extra is not None:
            msg += f" ({extra(i)})"
        print(msg)
    return len(bad)


def _params(B, lib, g, typical=False, V=1 << 30):
    T = g.choice([0.0, 0.5, 0.8, 1.0, 1.3], size=B).astype(np.float32)
    K = np.minimum(g.choice([0, 0, 1, 20, 50, 400], size=B), V).astype(np.int32)
    P = g.choice([1.0, 0.5, 0.9, 0.95], size=B).astype(np.float32)
    MP = g.choice([0.0, 0.0, 0.02, 0.1], size=B).astype(np.float32)
    R = g.choice([1.0, 1.1, 1.3], size=B).astype(np.float32)
    PR = g.choice([0.0, 0.4], size=B).astype(np.float32)
    FR = g.choice([0.0, 0.1], size=B).astype(np.float32)
    kw = dict(temperature=lib(T), top_k=lib(K), top_p=lib(P), min_p=lib(MP), repetition_penalty=lib(R),
              presence_penalty=lib(PR), frequency_penalty=lib(FR))
    if typical:  # all ones: every row's typical-p is off, but the call takes the multi-pass path
        kw["typical_p"] = lib(np.ones(B, np.float32))
    return S.Params(**kw)


def _inputs(B, V, seed):
    g = np.random.default_rng(seed)
    scale = np.array([4.0, 0.02, 1.0, 8.0])[np.arange(B) % 4][:, None]
    x = (g.standard_normal((B, V)) * scale).astype(np.float32)
    x[3::4] = np.round(x[3::4])  # ties
    Hm = 64
    hist = g.integers(-3, V + 3, size=(B, Hm)).astype(np.int32)
    hist[:, :10] = g.integers(0, V, size=(B, 1))  # a repeated token per row
    lens = g.integers(0, Hm + 5, size=B).astype(np.int32)
    seeds = g.integers(0, 2**62, size=B).astype(np.int64)
    pos = g.integers(0, 10**6, size=B).astype(np.int64)
    return g, x, hist, lens, seeds, pos


def _step(lib, x, hist, lens, seeds, pos, params, **kw):
    return S.decode_step(x, params, lib(seeds), lib(pos), history=lib(hist), history_lengths=lib(lens),
                         return_logprobs=True, **kw)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("V,B", [(1, 3), (7, 5), (1000, 9), (2053, 4), (4099, 33), (128256, 2), (151936, 6)])
def test_fused_equal_cpu(V, B, dtype):
    """Tokens exact (the weights are bit-identical, every mass an exact integer); logprobs close."""
    g, x, hist, lens, seeds, pos = _inputs(B, V, V * 7 + B)
    h = H(x).astype(dtype)
    pg = np.random.default_rng(V)
    pc = _params(B, C, np.random.default_rng(V), V=V)
    ph = _params(B, H, pg, V=V)
    rc = _step(C, h.to("cuda"), hist, lens, seeds, pos, pc)
    rh = _step(H, h, hist, lens, seeds, pos, ph)
    tc, th = N(rc.tokens), N(rh.tokens)
    assert _diff(f"tokens V={V} B={B} {dtype}", tc, th) == 0
    lc, lh = N(rc.logprobs), N(rh.logprobs)
    ok = np.isfinite(lh)
    assert np.array_equal(ok, np.isfinite(lc))
    err = np.abs(lc[ok] - lh[ok])
    print(f"\nV={V} B={B} {dtype}: max |logprob cuda - cpu| = {err.max() if err.size else 0:.3g}")
    np.testing.assert_allclose(lc[ok], lh[ok], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("V", [2053, 128256, 151936])
def test_fused_equals_multipass_bits(V):
    """The fused path and the multi-pass path give the same tokens and logprob bits."""
    B = 12
    g, x, hist, lens, seeds, pos = _inputs(B, V, V + 1)
    xc = C(x)
    ra = _step(C, xc, hist, lens, seeds, pos, _params(B, C, np.random.default_rng(1)))
    rb = _step(C, xc, hist, lens, seeds, pos, _params(B, C, np.random.default_rng(1), typical=True))
    assert _diff("tokens fused vs multipass", N(ra.tokens), N(rb.tokens)) == 0
    assert _diff("logprob bits fused vs multipass", N(ra.logprobs).view(np.uint32),
                 N(rb.logprobs).view(np.uint32)) == 0


@pytest.mark.parametrize("V", [128256, 151936])
def test_fused_batch_invariance_across_cluster_sizes(V):
    """B = 32 (8-CTA clusters) against single rows (16-CTA clusters where the GPU allows them)."""
    B = 32
    g, x, hist, lens, seeds, pos = _inputs(B, V, 11)
    pn = _params(B, np.asarray, np.random.default_rng(2))
    pc = S.Params(**{k: C(getattr(pn, k)) for k in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                                                      "presence_penalty", "frequency_penalty")})
    full = _step(C, C(x), hist, lens, seeds, pos, pc)
    tf, lf = N(full.tokens), N(full.logprobs).view(np.uint32)
    for r in (0, 1, 7, 19, 31):
        sl = slice(r, r + 1)
        p1 = S.Params(**{k: C(getattr(pn, k)[sl]) for k in ("temperature", "top_k", "top_p", "min_p",
                                                            "repetition_penalty", "presence_penalty",
                                                            "frequency_penalty")})
        one = _step(C, C(x[sl]), hist[sl], lens[sl], seeds[sl], pos[sl], p1)
        assert int(N(one.tokens)[0]) == int(tf[r]), f"row {r}: alone {int(N(one.tokens)[0])}, in batch {tf[r]}"
        assert N(one.logprobs).view(np.uint32)[0] == lf[r], f"row {r}: logprob bits differ"
    four = _step(C, C(x[4:8]), hist[4:8], lens[4:8], seeds[4:8], pos[4:8],
                 S.Params(**{k: C(getattr(pn, k)[4:8]) for k in ("temperature", "top_k", "top_p", "min_p",
                                                                 "repetition_penalty", "presence_penalty",
                                                                 "frequency_penalty")}))
    assert _diff("B=4 vs B=32 tokens", N(four.tokens), tf[4:8]) == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_unaligned_rows(dtype):
    """Rows that start off a 16-byte boundary (scalar loads) and a padded row stride."""
    B, V = 5, 30011
    g = np.random.default_rng(4)
    big = (g.standard_normal((B, V + 9)) * 3).astype(np.float32)
    hb = H(big).astype(dtype)
    xs_h = hb[:, 3:3 + V]
    xs_c = hb.to("cuda")[:, 3:3 + V]
    seeds, pos = np.arange(B, dtype=np.int64), np.full(B, 9, np.int64)
    p = S.Params(temperature=0.9, top_k=300, top_p=0.9)
    a = N(S.decode_step(xs_c, p, C(seeds), C(pos), return_logprobs=True).tokens)
    b = N(S.decode_step(xs_h, p, H(seeds), H(pos), return_logprobs=True).tokens)
    assert _diff("unaligned tokens", a, b) == 0


def test_fused_long_history_bans_bias_eos():
    B, V, Hm = 3, 50000, 5000
    g = np.random.default_rng(12)
    x = (g.standard_normal((B, V)) * 2).astype(np.float32)
    hist = g.integers(0, 300, size=(B, Hm)).astype(np.int32)  # heavy repeats: counts up to ~40
    lens = np.array([Hm, 17, 0], np.int32)
    bias = (g.standard_normal(V) * 0.5).astype(np.float32)
    banned = np.array([[1, 2, 3], [V - 1, 0, 5], [7, 7, 7]], np.int32)
    eos = np.array([10, 11], np.int32)
    gen = np.array([0, 5, 100], np.int32)
    seeds, pos = np.array([3, 4, 5], np.int64), np.array([0, 1, 2], np.int64)

    def run(L):
        p = S.Params(temperature=L(np.array([0.8, 1.0, 1.2], np.float32)),
                     top_p=L(np.array([0.95, 0.9, 1.0], np.float32)),
                     repetition_penalty=L(np.array([1.2, 1.0, 1.1], np.float32)),
                     presence_penalty=L(np.array([0.5, 0.1, 0.0], np.float32)),
                     frequency_penalty=L(np.array([0.05, 0.0, 0.3], np.float32)),
                     min_tokens=L(np.array([3, 3, 3], np.int32)))
        return S.decode_step(L(x), p, L(seeds), L(pos), history=L(hist), history_lengths=L(lens),
                             logit_bias=L(bias), banned=L(banned), eos_ids=L(eos), generated=L(gen),
                             return_logprobs=True)
    n_same = 0
    for t in range(20):
        pos[:] = t
        rc, rh = run(C), run(H)
        assert _diff(f"step {t} tokens", N(rc.tokens), N(rh.tokens)) == 0
        np.testing.assert_allclose(N(rc.logprobs), N(rh.logprobs), rtol=1e-5, atol=1e-5)
        n_same += 1
    assert n_same == 20


def test_fused_graph_replay_bits_and_bad_rows():
    B, V = 4, 151936
    g = np.random.default_rng(13)
    x = (g.standard_normal((B, V)) * 2).astype(np.float32)
    x[1, :] = np.nan           # no finite logit: token -1, logprob NaN
    x[2, ::2] = -np.inf
    x[3, 100] = np.inf         # +inf counts as the largest finite float
    xc = C(x)
    params = S.Params(temperature=C(np.array([0.7, 1.0, 0.9, 1.2], np.float32)),
                      top_p=C(np.array([0.9, 0.9, 0.95, 0.8], np.float32)),
                      top_k=C(np.array([0, 40, 0, 0], np.int32)))
    seeds = C(np.arange(B, dtype=np.int64) + 100)
    pos = C(np.zeros(B, np.int64))
    hist = C(g.integers(0, V, size=(B, 16)).astype(np.int32))
    lens = C(np.array([16, 4, 8, 0], np.int32))

    def step():
        return S.decode_step(xc, params, seeds, pos, history=hist, history_lengths=lens, return_logprobs=True)
    gr = gk.Graph(gk.Stream("cuda"))
    with gr:
        res = step()
    for k in range(4):
        gk.copy_into(pos, H(np.full(B, k, np.int64)))
        gk.synchronize("cuda")
        gr.replay()
        gr.stream.synchronize()
        eager = step()
        assert _diff(f"replay {k} tokens", N(res.tokens), N(eager.tokens)) == 0
        assert _diff(f"replay {k} logprob bits", N(res.logprobs).view(np.uint32),
                     N(eager.logprobs).view(np.uint32)) == 0
        t = N(eager.tokens)
        assert t[1] == -1 and np.isnan(N(eager.logprobs)[1])
        assert t[2] % 2 == 1
        assert t[3] == 100


def test_fused_sample_topk_equal_cpu():
    g = np.random.default_rng(21)
    for V in (128256, 151936):
        x = (g.standard_normal((8, V)) * 3).astype(np.float32)
        x[4:] *= 0.01
        for kw in (dict(top_k=50), dict(top_k=1), dict(top_p=0.9), dict(min_p=0.05, temperature=0.7),
                   dict(temperature=0.0)):
            for pos in (0, 1):
                a = N(S.sample(C(x), seed=5, position=pos, **kw))
                b = N(S.sample(H(x), seed=5, position=pos, **kw))
                assert _diff(f"sample V={V} {kw} pos={pos}", a, b) == 0


def test_fused_int32_positions_equal_int64():
    g = np.random.default_rng(32)
    x = C((g.standard_normal((5, 151936)) * 2).astype(np.float32))
    seeds = C(np.arange(5, dtype=np.int64) + 9)
    p = S.Params(temperature=0.9, top_p=0.9)
    pos = np.arange(5) + 1000
    a = N(S.decode_step(x, p, seeds, C(pos.astype(np.int64))).tokens)
    b = N(S.decode_step(x, p, seeds, C(pos.astype(np.int32))).tokens)
    c = N(S.decode_step(H(N(x)), p, H(N(seeds)), H(pos.astype(np.int64))).tokens)
    assert _diff("int32 vs int64 positions", a, b) == 0
    assert _diff("cuda vs cpu", a, c) == 0
