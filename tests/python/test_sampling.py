"""gpukit.sampling on the CPU: exact references (tests/python/sampling_ref.py),
chi-square goodness of fit of seeded draws, and bad input."""
import os
import sys

import numpy as np
import pytest

import gpukit as gk

sys.path.insert(0, os.path.dirname(__file__))
import sampling_ref as ref  # noqa: E402

S = gk.sampling
rng = np.random.default_rng(1234)


def A(x):
    return gk.asarray(np.ascontiguousarray(x))


def N(x):
    return gk.to_numpy(x)


def test_philox_known_answers():
    assert S._philox(0, 0, 0, 0, 0, 0) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    assert S._philox(*[0xFFFFFFFF] * 6) == (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)
    pi = (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, 0xA4093822, 0x299F31D0)
    assert S._philox(*pi) == (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)
    for c in rng.integers(0, 2**32, size=(20, 6)):
        c = [int(v) for v in c]
        assert list(S._philox(*c)) == ref.philox4x32_10(c[:4], c[4:])


# ---------------------------------------------------------------- argmax / topk
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_argmax_topk_exact_with_ties(dtype):
    x = rng.integers(-8, 8, size=(5, 301)).astype(np.float32)  # many ties
    x[2] = 3.0
    x[3, 7] = -0.0
    x[3, 8] = 0.0
    g = A(x).astype(dtype)
    xf = N(g.astype("float32"))
    am = N(S.argmax(g))
    assert am.dtype == np.int32
    np.testing.assert_array_equal(am, np.argmax(xf, axis=1))
    for k in (1, 5, 64, 301):
        v, i = S.topk(g, k)
        order = np.lexsort((np.arange(301)[None].repeat(5, 0), -xf), axis=1)[:, :k]
        np.testing.assert_array_equal(N(i), order)
        np.testing.assert_array_equal(N(v), np.take_along_axis(xf, order, 1))


def test_topk_strided_rows_and_1d():
    big = rng.standard_normal((4, 500)).astype(np.float32)
    g = A(big)[:, 3:400]  # row stride 500
    v, i = S.topk(g, 7)
    ref_i = np.argsort(-big[:, 3:400], axis=1, kind="stable")[:, :7]
    np.testing.assert_array_equal(N(i), ref_i)
    g2 = A(big)[:, ::2]  # element stride 2
    np.testing.assert_array_equal(N(S.argmax(g2)), np.argmax(big[:, ::2], 1))
    assert int(N(S.argmax(A(big[1])))) == int(np.argmax(big[1]))


# ---------------------------------------------------------------- processors
def test_temperature_bias_ban_min_tokens():
    x = rng.standard_normal((3, 50)).astype(np.float32)
    np.testing.assert_array_equal(N(S.apply_temperature(A(x), 0.7)), x / np.float32(0.7))
    b = rng.standard_normal(50).astype(np.float32)
    np.testing.assert_array_equal(N(S.apply_logit_bias(A(x), A(b))), x + b)
    b2 = rng.standard_normal((3, 50)).astype(np.float32)
    np.testing.assert_array_equal(N(S.apply_logit_bias(A(x), A(b2))), x + b2)
    out = N(S.ban_tokens(A(x), A(np.array([3, 7, -1, 50, 9999], np.int32))))
    e = x.copy()
    e[:, [3, 7]] = -np.inf
    np.testing.assert_array_equal(out, e)
    out = N(S.ban_tokens(A(x), A(np.array([[1, 2], [3, 3], [-5, 49]], np.int32))))
    e = x.copy()
    e[0, [1, 2]] = e[1, 3] = e[2, 49] = -np.inf
    np.testing.assert_array_equal(out, e)
    out = N(S.apply_min_tokens(A(x), A(np.array([0, 5], np.int32)), A(np.array([0, 3, 4], np.int32)), 4))
    e = x.copy()
    e[:2, [0, 5]] = -np.inf
    np.testing.assert_array_equal(out, e)


def test_penalties_against_reference():
    B, V, H = 4, 64, 40
    x = (rng.standard_normal((B, V)) * 3).astype(np.float32)
    hist = rng.integers(-3, V + 3, size=(B, H)).astype(np.int32)  # includes out-of-range ids
    lens = np.array([0, 10, H, H + 100], np.int32)  # lengths past Hmax are clamped
    hist[0, :] = 2 ** 30
    out = N(S.apply_penalties(A(x), A(hist), A(lens), 1.3, 0.5, 0.25))
    for r in range(B):
        L = min(max(lens[r], 0), H)
        np.testing.assert_array_equal(out[r], ref.penalize(x[r], list(hist[r, :L]), 1.3, 0.5, 0.25))
    # lengths beyond the real length are never read: poison after the length
    hist2 = hist.copy()
    hist2[1, 10:] = 5
    out2 = N(S.apply_penalties(A(x), A(hist2), A(lens), 1.3, 0.5, 0.25))
    np.testing.assert_array_equal(out2[1], out[1])


# ---------------------------------------------------------------- filters
def families(V, seed=0):
    g = np.random.default_rng(seed)
    peaked = (g.standard_normal(V) * 4).astype(np.float32)
    flat = (g.standard_normal(V) * 0.01).astype(np.float32)
    ties = g.integers(0, 4, size=V).astype(np.float32) * 0.5
    return {"peaked": peaked, "flat": flat, "ties": ties}


FILTERS = [
    dict(top_k=1), dict(top_k=5), dict(top_k=37),
    dict(top_p=0.5), dict(top_p=0.9), dict(top_p=0.999),
    dict(min_p=0.05), dict(min_p=0.5),
    dict(typical_p=0.3), dict(typical_p=0.9),
    dict(top_k=20, top_p=0.8, min_p=0.02), dict(top_k=30, typical_p=0.7),
]


def apply_filter_op(g, kw):
    if list(kw) == ["top_k"]:
        return S.top_k_filter(g, kw["top_k"])
    if list(kw) == ["top_p"]:
        return S.top_p_filter(g, kw["top_p"])
    if list(kw) == ["min_p"]:
        return S.min_p_filter(g, kw["min_p"])
    if list(kw) == ["typical_p"]:
        return S.typical_p_filter(g, kw["typical_p"])
    return None


@pytest.mark.parametrize("kw", FILTERS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
@pytest.mark.parametrize("fam", ["peaked", "flat", "ties"])
def test_filter_exact(kw, fam):
    V = 257
    s = families(V, 7)[fam]
    keep, _ = ref.kept_mask(s, **kw)
    out = apply_filter_op(A(s[None]), kw)
    if out is None:
        pytest.skip("combination: covered by the draw tests")
    out = N(out)[0]
    np.testing.assert_array_equal(np.isfinite(out), keep)
    np.testing.assert_array_equal(out[keep], s[keep])


def test_top_p_hand_case():
    # probs 0.5, 0.25, 0.125, 0.125: p=0.7 keeps the first two; p=0.8 keeps all (tie)
    s = np.log(np.array([0.125, 0.5, 0.125, 0.25], np.float32))
    assert np.isfinite(N(S.top_p_filter(A(s), 0.7))).tolist() == [False, True, False, True]
    assert np.isfinite(N(S.top_p_filter(A(s), 0.8))).tolist() == [True, True, True, True]
    assert np.isfinite(N(S.top_k_filter(A(s), 2))).tolist() == [False, True, False, True]
    assert np.isfinite(N(S.top_k_filter(A(s), 3))).tolist() == [True, True, True, True]  # boundary ties kept
    assert np.isfinite(N(S.min_p_filter(A(s), 0.5))).tolist() == [False, True, False, True]


# ---------------------------------------------------------------- draws
@pytest.mark.parametrize("kw", [dict(), dict(top_k=3), dict(top_p=0.9), dict(min_p=0.1), dict(typical_p=0.8),
                                dict(top_k=10, top_p=0.7)])
def test_draw_matches_reference_exactly(kw):
    V = 97
    mism = 0
    n = 0
    for fam, s in families(V, 3).items():
        Bn = 60
        x = np.repeat(s[None], Bn, 0)
        toks = N(S.sample(A(x), seed=99, position=5, **kw))
        for r in range(Bn):
            n += 1
            mism += int(toks[r] != ref.draw(s, 99, 5, r, **kw))
    assert mism == 0, f"{mism} of {n} draws differ from the reference (the weights use the same exp: none may)"


@pytest.mark.parametrize("kw", ref.CHI_SETTINGS, ids=ref.chi_setting_id)
@pytest.mark.parametrize("fam", list(ref.CHI_FAMILIES))
def test_chi_square(kw, fam):
    s = ref.CHI_FAMILIES[fam]
    n = 40000
    x = np.repeat(s[None], n, 0)
    toks = N(S.sample(A(x), seed=2024, position=11, **kw))
    ref.check_draw_counts(np.bincount(toks, minlength=s.size).astype(np.float64), s, kw, fam)


def test_greedy_and_determinism_and_batch_invariance():
    V = 1000
    x = (rng.standard_normal((6, V)) * 2).astype(np.float32)
    seeds = np.array([11, 22, 33, 44, 55, 66], np.int64)
    pos = np.array([0, 1, 2, 3, 4, 5], np.int64)
    p = S.Params(temperature=A(np.array([0.8, 0, 1.2, -1, 0.5, 1.0], np.float32)), top_p=0.9)
    r1 = S.decode_step(A(x), p, A(seeds), A(pos))
    r2 = S.decode_step(A(x), p, A(seeds), A(pos))
    t1 = N(r1.tokens)
    np.testing.assert_array_equal(t1, N(r2.tokens))
    assert t1[1] == np.argmax(x[1]) and t1[3] == np.argmax(x[3])
    # each row alone, and in a permuted batch: same tokens
    temps = np.array([0.8, 0, 1.2, -1, 0.5, 1.0], np.float32)
    for r in range(6):
        one = S.decode_step(A(x[r:r + 1]), S.Params(temperature=A(temps[r:r + 1]), top_p=0.9), A(seeds[r:r + 1]),
                            A(pos[r:r + 1]))
        assert int(N(one.tokens)[0]) == t1[r]
    perm = np.array([5, 3, 1, 0, 2, 4])
    rp = S.decode_step(A(x[perm]), S.Params(temperature=A(temps[perm]), top_p=0.9), A(seeds[perm]), A(pos[perm]))
    np.testing.assert_array_equal(N(rp.tokens), t1[perm])
    # a draw equals the reference for row tag 0
    s0 = (x[0] / np.float32(0.8)).astype(np.float32)
    assert t1[0] == ref.draw(s0, 11, 0, 0, top_p=0.9)


def test_decode_step_full_pipeline_against_reference():
    B, V, H = 5, 300, 20
    x = (rng.standard_normal((B, V)) * 2).astype(np.float32)
    hist = rng.integers(0, V, size=(B, H)).astype(np.int32)
    lens = np.array([0, 5, 20, 13, 7], np.int32)
    bias = rng.standard_normal(V).astype(np.float32) * 0.1
    banned = np.array([[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]], np.int32)
    eos = np.array([0, 299], np.int32)
    gen = np.array([0, 5, 10, 0, 1], np.int32)
    T = np.array([0.7, 1.0, 0.0, 1.3, 0.9], np.float32)
    params = S.Params(temperature=A(T), top_k=A(np.array([0, 50, 0, 10, 300], np.int32)),
                      top_p=A(np.array([0.9, 1.0, 1.0, 0.5, 0.95], np.float32)),
                      min_p=A(np.array([0, 0.01, 0, 0, 0.05], np.float32)),
                      repetition_penalty=A(np.array([1.2, 1.0, 1.1, 1.5, 1.05], np.float32)),
                      presence_penalty=A(np.array([0.1, 0, 0.2, 0, 0.3], np.float32)),
                      frequency_penalty=A(np.array([0.05, 0.1, 0, 0, 0.2], np.float32)),
                      min_tokens=A(np.array([1, 1, 20, 0, 2], np.int32)))
    seeds = np.array([5, 6, 7, 8, 9], np.int64)
    pos = np.array([3, 3, 3, 4, 100], np.int64)
    res = S.decode_step(A(x), params, A(seeds), A(pos), history=A(hist), history_lengths=A(lens),
                        logit_bias=A(bias), banned=A(banned), eos_ids=A(eos), generated=A(gen),
                        return_logprobs=True, top_logprobs=3)
    toks, lps, tids, tlps = N(res.tokens), N(res.logprobs), N(res.top_ids), N(res.top_logprobs)
    topk = [0, 50, 0, 10, 300]
    topp = [0.9, 1.0, 1.0, 0.5, 0.95]
    minp = [0, 0.01, 0, 0, 0.05]
    rep = [1.2, 1.0, 1.1, 1.5, 1.05]
    pres = [0.1, 0, 0.2, 0, 0.3]
    freq = [0.05, 0.1, 0, 0, 0.2]
    mint = [1, 1, 20, 0, 2]
    for r in range(B):
        v = (x[r] + bias).astype(np.float32)
        v = ref.penalize(v, list(hist[r, :lens[r]]), rep[r], pres[r], freq[r])
        v[banned[r]] = -np.inf
        if gen[r] < mint[r]:
            v[eos] = -np.inf
        s = v if T[r] <= 0 else (v / T[r]).astype(np.float32)
        if T[r] <= 0:
            exp_tok = int(np.argmax(s))
        else:
            k = topk[r] if 0 < topk[r] < V else None
            exp_tok = ref.draw(s, int(seeds[r]), int(pos[r]), 0, top_k=k, top_p=topp[r], min_p=minp[r])
        assert toks[r] == exp_tok, r
        ls = s.astype(np.float64) - s.max()
        ls -= np.log(np.exp(ls).sum())
        np.testing.assert_allclose(lps[r], ls[exp_tok], rtol=1e-5, atol=1e-5)
        order = np.argsort(-s, kind="stable")[:3]
        np.testing.assert_array_equal(tids[r], order)
        np.testing.assert_allclose(tlps[r], ls[order], rtol=1e-5, atol=1e-5)


def test_bf16_logits_equal_f32_of_same_values():
    x = (rng.standard_normal((8, 500)) * 3).astype(np.float32)
    gb = A(x).astype("bfloat16")
    gf = gb.astype("float32")
    for kw in (dict(top_p=0.9), dict(top_k=20), dict(temperature=0)):
        np.testing.assert_array_equal(N(S.sample(gb, seed=3, **kw)), N(S.sample(gf, seed=3, **kw)))


# ---------------------------------------------------------------- bad input
def test_bad_input():
    x = A(rng.standard_normal((2, 10)).astype(np.float32))
    for k in (0, -1, 11):
        with pytest.raises(ValueError, match="k"):
            S.topk(x, k)
        with pytest.raises(ValueError, match="k"):
            S.top_k_filter(x, k)
        with pytest.raises(ValueError, match="top_k"):
            S.sample(x, top_k=k)
    for p in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="p"):
            S.top_p_filter(x, p)
        with pytest.raises(ValueError, match="top_p"):
            S.sample(x, top_p=p)
        with pytest.raises(ValueError, match="p"):
            S.typical_p_filter(x, p)
    with pytest.raises(ValueError, match="min_p"):
        S.min_p_filter(x, 1.5)
    with pytest.raises(ValueError, match="temperature"):
        S.apply_temperature(x, 0.0)
    with pytest.raises(ValueError, match="temperature"):
        S.sample(x, temperature=float("nan"))
    with pytest.raises(TypeError, match="logits"):
        S.argmax(A(np.zeros((2, 3), np.int32)))
    with pytest.raises(ValueError, match="logits"):
        S.argmax(A(np.zeros((2, 3, 4), np.float32)))
    with pytest.raises(ValueError, match="logits"):
        S.argmax(A(np.zeros((2, 0), np.float32)))
    with pytest.raises(ValueError, match="history"):
        S.apply_penalties(x, A(np.zeros((3, 4), np.int32)), A(np.zeros(2, np.int32)), 1.1, 0, 0)
    with pytest.raises(TypeError, match="history"):
        S.apply_penalties(x, A(np.zeros((2, 4), np.float32)), A(np.zeros(2, np.int32)), 1.1, 0, 0)
    with pytest.raises(ValueError, match="history_lengths"):
        S.apply_penalties(x, A(np.zeros((2, 4), np.int32)), A(np.zeros(3, np.int32)), 1.1, 0, 0)
    with pytest.raises(ValueError, match="repetition"):
        S.apply_penalties(x, A(np.zeros((2, 4), np.int32)), A(np.zeros(2, np.int32)), 0.0, 0, 0)
    with pytest.raises(ValueError, match="logit_bias"):
        S.apply_logit_bias(x, A(np.zeros(9, np.float32)))
    seeds, pos = A(np.array([1, 2], np.int64)), A(np.array([0, 0], np.int64))
    with pytest.raises(ValueError, match=r"params.top_p\[1\]"):
        S.decode_step(x, S.Params(top_p=A(np.array([0.5, 1.5], np.float32))), seeds, pos)
    with pytest.raises(ValueError, match=r"params.top_k\[0\]"):
        S.decode_step(x, S.Params(top_k=A(np.array([11, 0], np.int32))), seeds, pos)
    with pytest.raises(ValueError, match=r"params.temperature\[0\]"):
        S.decode_step(x, S.Params(temperature=A(np.array([np.nan, 1], np.float32))), seeds, pos)
    with pytest.raises(ValueError, match="seeds"):
        S.decode_step(x, None, A(np.array([1, 2, 3], np.int64)), pos)
    with pytest.raises(ValueError, match="top_logprobs"):
        S.decode_step(x, None, seeds, pos, top_logprobs=-1)
    with pytest.raises(ValueError, match="params"):
        S.decode_step(x, {"top_q": 1}, seeds, pos)


def test_nan_inf_rows():
    x = rng.standard_normal((3, 10)).astype(np.float32)
    x[1, 4] = np.nan
    with pytest.raises(ValueError, match="row 1 contains NaN"):
        S.argmax(A(x))
    with pytest.raises(ValueError, match="NaN"):
        S.sample(A(x), seed=1)
    with pytest.raises(ValueError, match="NaN"):
        S.decode_step(A(x), None, A(np.arange(3)), A(np.zeros(3, np.int64)))
    y = rng.standard_normal((3, 10)).astype(np.float32)
    y[0, :] = -np.inf
    y[1, 3] = y[1, 6] = np.inf
    r = S.decode_step(A(y), S.Params(top_p=0.9), A(np.arange(3)), A(np.zeros(3, np.int64)), return_logprobs=True)
    t, lp = N(r.tokens), N(r.logprobs)
    assert t[0] == -1 and np.isnan(lp[0])
    assert t[1] in (3, 6)
    assert t[2] >= 0
    # +inf stays the winner after a temperature that would overflow it
    r = S.decode_step(A(y), S.Params(temperature=0.01, top_k=3), A(np.arange(3)), A(np.zeros(3, np.int64)))
    assert int(N(r.tokens)[1]) in (3, 6)
    big = np.full((1, 6), 3e38, np.float32)
    big[0, 2] = 1.0
    r = S.decode_step(A(big), S.Params(temperature=0.5), A(np.arange(1)), A(np.zeros(1, np.int64)),
                      return_logprobs=True)
    assert int(N(r.tokens)[0]) in (0, 1, 3, 4, 5) and np.isfinite(N(r.logprobs)[0])
    # everything banned: -1
    r = S.decode_step(A(y[2:]), None, A(np.arange(1)), A(np.zeros(1, np.int64)), banned=A(np.arange(10)))
    assert int(N(r.tokens)[0]) == -1
    assert N(S.top_p_filter(A(y[:1]), 0.5)).tolist() == [[-np.inf] * 10]


def test_history_ids_out_of_range_are_ignored():
    x = rng.standard_normal((1, 16)).astype(np.float32)
    hist = np.array([[-1, 16, 2**31 - 1, -2**31, 3]], np.int32)
    out = N(S.apply_penalties(A(x), A(hist), A(np.array([5], np.int32)), 2.0, 1.0, 1.0))
    np.testing.assert_array_equal(out[0], ref.penalize(x[0], [3], 2.0, 1.0, 1.0))
    out = N(S.apply_penalties(A(x), A(hist), A(np.array([-7], np.int32)), 2.0, 1.0, 1.0))
    np.testing.assert_array_equal(out, x)


def test_registered_for_both_backends():
    ops = {n: (c, g) for n, c, g in gk.registered_ops()}
    for name in ("sampling.argmax", "sampling.topk", "sampling.decode_step", "sampling.sample"):
        assert ops[name][0]


def test_temperature_zero_is_greedy_in_sample():
    x = rng.standard_normal((9, 333)).astype(np.float32)
    for t in (0.0, -1.0):
        np.testing.assert_array_equal(N(S.sample(A(x), temperature=t, top_p=0.5, seed=4)), np.argmax(x, 1))


def test_int32_positions_equal_int64():
    """decode_step reads int32 positions (the engine passes its lengths) without converting."""
    g = np.random.default_rng(31)
    x = gk.asarray((g.standard_normal((6, 3000)) * 2).astype(np.float32))
    seeds = gk.asarray(np.arange(6, dtype=np.int64) + 9)
    p = S.Params(temperature=0.9, top_p=0.9)
    for base in (0, 7, 2**31 - 10):
        pos = np.arange(6) + base
        a = N(S.decode_step(x, p, seeds, gk.asarray(pos.astype(np.int64))).tokens)
        b = N(S.decode_step(x, p, seeds, gk.asarray(pos.astype(np.int64).astype(np.int32))).tokens)
        np.testing.assert_array_equal(a, b)
