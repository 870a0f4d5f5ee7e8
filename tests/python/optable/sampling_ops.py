"""Op-table entries of gk.sampling (format: tests/python/harness.py).

The references are those of tests/python/sampling_ref.py (thresholds from sorting, exact integer
masses, a pure-Python Philox for the draw).  Everything deterministic is compared exactly:
argmax/topk, the processors (their parameters are chosen so that every float operation is exact
or one correctly rounded IEEE operation: penalties with a power-of-two frequency give the same
bits with and without a fused multiply-add), the filters' masks (on logits from a coarse grid, so
no mass or min-p boundary is within rounding of a threshold) and the seeded draws (greedy rows,
peaked rows whose winner is the only token of nonzero weight, and the exact reference draw on
grid logits).  Statistical tests and bad input live in test_sampling.py / test_sampling_cuda.py.
"""
import numpy as np

import gpukit as gk
import sampling_ref as sref
from harness import GENERIC_VIEWS, OpSpec

S = gk.sampling
LOGITS = ("float32", "bfloat16", "float16")


def _view(fn):
    return (fn, fn)


# layout -> (base shape, view) of the logits; the shape after the view is [B, V] or [V] (one row).
_LOGITS = {
    "v1": ((4, 1), None),
    "row7": ((7,), None),
    "b3_v1023": ((3, 1023), None),
    "b2_v4097": ((2, 4097), None),
    "rows_strided": ((5, 300), _view(lambda a: a[::2, 3:260])),   # row stride 300, odd start
    "cols_step2": ((3, 514), "cols_step2"),                        # element stride 2 (copied)
    "transposed": ((33, 4), "T"),
    "offset": ((4, 101), "offset1"),
}
LAYOUTS = tuple(_LOGITS)
WIDE = tuple(x for x in LAYOUTS if x != "v1")  # V >= 7


def _bv(layout):
    """(B, V) of a logits layout ([V] is one row)."""
    base, view = _LOGITS[layout]
    shape = np.empty(base)
    if view is not None:
        shape = (view[1] if isinstance(view, tuple) else GENERIC_VIEWS[view][1])(shape)
    shape = shape.shape
    return (1, shape[0]) if len(shape) == 1 else shape


def _plan(*extras):
    """The logits, then the extra inputs that extras(B, V) gives for the layout."""
    def plan(layout):
        if layout not in _LOGITS:
            return None
        B, V = _bv(layout)
        items = [_LOGITS[layout]]
        for e in extras:
            items += e(B, V)
        return items
    return plan


def _fixed(a):
    a = np.asarray(a, np.float64)
    return [(a.shape, None, a)]


def _rows(x):
    """The logits as float32 rows [B, V] (the ops convert f16/bf16 exactly)."""
    x = np.asarray(x, np.float32)
    return x[None] if x.ndim == 1 else x


def _like(out, x):
    """Row results back to x's rank: [B, ...] -> [...] for 1-d logits."""
    return out[0] if np.ndim(x) == 1 else out


def _grid(rng, shape, dtype, index):
    """Logits on a 0.25 grid: ties everywhere, exact in every dtype."""
    return rng.integers(-16, 17, size=shape) * 0.25


def _view_rows(base):
    """For the logits layout of base shape `base`: the flat base index of every element of the
    view, as a [B, V] array (the views are the same on every input of that shape)."""
    for b, view in _LOGITS.values():
        if tuple(b) == tuple(base):
            idx = np.arange(int(np.prod(b))).reshape(b)
            if view is not None:
                idx = (view[1] if isinstance(view, tuple) else GENERIC_VIEWS[view][1])(idx)
            return idx.reshape(-1, idx.shape[-1])
    raise ValueError(f"no logits layout has base shape {base}")


def _peaked(rng, shape, dtype, index, lo=0, hi=0):
    """Uniform logits plus one winner in each row of the view (at a column in [lo, V - hi)),
    40 above the rest: every other token weighs floor(exp(-37) * 2**40) = 0, so a draw can only
    give the winner."""
    v = rng.uniform(-3, 3, size=shape)
    rows = _view_rows(shape)
    cols = rng.integers(lo, rows.shape[1] - hi, size=rows.shape[0])
    v.reshape(-1)[rows[np.arange(rows.shape[0]), cols]] = 43.0
    return v


def _decode_gen(rng, shape, dtype, index):
    """Peaked logits whose winner is never banned nor an EOS id (see _decode_extras); the bias."""
    if index == 0:
        return _peaked(rng, shape, dtype, index, lo=3, hi=2)
    return rng.uniform(-0.5, 0.5, size=shape)


def _argmax_ref(x):
    return _like(np.argmax(_rows(x), axis=1), x)


def _topk_ref(x, k):
    r = _rows(x)
    idx = np.argsort(-r.astype(np.float64), axis=1, kind="stable")[:, :k]
    return _like(np.take_along_axis(r, idx, 1), x), _like(idx, x)


def _k(x):
    return min(5, x.shape[-1])


# ---- processors ----
def _history(B, V):
    """history [B, 9] with out-of-range ids, lengths [B] including 0 and one past the width."""
    r = np.random.default_rng(B * 7919 + V)
    h = r.integers(-2, V + 2, size=(B, 9))
    h[:, :3] = r.integers(0, min(V, 4), size=(B, 3))  # repeated ids: counts above 1
    lens = np.arange(B) * 4 % 11  # 0, 4, 8, 1 (clamped to 9 past the width), ...
    return _fixed(h) + _fixed(lens)


REP, PRES, FREQ = 1.25, 0.5, 0.25  # FREQ * count is exact: fma or not, the same bits


def _penalties_ref(x, hist, lens, rep=REP, pres=PRES, freq=FREQ):
    r = _rows(x).copy()
    h, L = _ints(hist), _ints(lens)
    for b in range(r.shape[0]):
        n = min(max(int(L[b]), 0), h.shape[1])
        r[b] = sref.penalize(r[b], list(h[b, :n]), rep, pres, freq)
    return _like(r, x)


def _ints(a):
    return np.asarray(a).astype(np.int64)


def _bias_row(B, V):
    return [((V,), None)]


def _bias_rows(B, V):
    return [((B, V), None)]


def _bias_ref(x, b):
    return _like(_rows(x) + np.asarray(b, np.float32), x)


def _banned_1d(B, V):
    return _fixed([3, V - 1, -1, V, 2 ** 30, 3])  # out of range ids ignored, duplicates fine


def _banned_2d(B, V):
    r = np.random.default_rng(V + B)
    ids = r.integers(-1, V + 1, size=(B, 3))
    return _fixed(ids)


def _ban_ref(x, ids):
    r = _rows(x).copy()
    ids = _ints(ids)
    V = r.shape[1]
    for b in range(r.shape[0]):
        row_ids = ids if ids.ndim == 1 else ids[b]
        for i in row_ids:
            if 0 <= i < V:
                r[b, i] = -np.inf
    return _like(r, x)


MIN_TOKENS = 4


def _eos(B, V):
    return _fixed([0, V - 1]) + _fixed(np.arange(B) * 3 % 7)  # generated 0, 3, 6, 2, ...: some below 4


def _min_tokens_ref(x, eos, gen):
    r = _rows(x).copy()
    for b in range(r.shape[0]):
        if _ints(gen)[b] < MIN_TOKENS:
            r[b, _ints(eos)] = -np.inf
    return _like(r, x)


# ---- filters ----
def _filter_ref(**kw):
    def ref(x):
        r = _rows(x)
        out = np.empty_like(r)
        for b in range(r.shape[0]):
            keep, _ = sref.kept_mask(r[b], **kw)
            out[b] = np.where(keep, r[b], np.float32(-np.inf))
        return _like(out, x)
    return ref


# ---- draws ----
def _draw_ref(seed, position, **kw):
    def ref(x):
        r = _rows(x)
        return _like(np.array([sref.draw(r[b], seed, position, b, **kw) for b in range(r.shape[0])]), x)
    return ref


# ---- decode_step ----
# Per-row parameters of the fused step, cycled over the rows: greedy rows (temperature <= 0) and
# rows with temperature, top-k/p, min-p, typical-p and penalties, all on peaked logits.
_PARAMS = {  # name: (values cycled over rows, dtype)
    "temperature": ([0.0, 0.5, 1.0, -1.0, 1.25], "float32"),
    "top_k": ([0, 3, 0, 5, 50], "int32"),
    "top_p": ([1.0, 0.9, 0.5, 1.0, 0.75], "float32"),
    "min_p": ([0.0, 0.0, 0.1, 0.0, 0.05], "float32"),
    "typical_p": ([1.0, 1.0, 1.0, 0.8, 0.9], "float32"),
    "repetition_penalty": ([1.25, 1.0, 2.0, 1.5, 1.0], "float32"),
    "presence_penalty": ([0.5, 0.0, 0.25, 0.0, 1.0], "float32"),
    "frequency_penalty": ([0.25, 0.5, 0.0, 0.125, 0.0], "float32"),
    "min_tokens": ([2, 0, 5, 1, 0], "int32"),
}
_PNAMES = tuple(_PARAMS)
TOP_N = 3


def _cycle(vals, B):
    return np.array([vals[b % len(vals)] for b in range(B)], np.float64)


# Real draws on grid logits (no processors, dyadic temperatures: the processed logits stay exact)
# against the reference draw.
_DRAW_PARAMS = dict(_PARAMS, **{
    "temperature": ([0.5, 1.0, 0.0, 1.0, 0.25], "float32"),
    "top_k": ([0, 5, 0, 0, 20], "int32"),
    "top_p": ([0.9, 1.0, 1.0, 0.5, 0.8], "float32"),
    "min_p": ([0.0, 0.0, 0.0, 0.3, 0.0], "float32"),
    "typical_p": ([1.0, 1.0, 1.0, 1.0, 0.7], "float32"),
    "repetition_penalty": ([1.0], "float32"),
    "presence_penalty": ([0.0], "float32"),
    "frequency_penalty": ([0.0], "float32"),
    "min_tokens": ([0], "int32"),
})
assert tuple(_DRAW_PARAMS) == _PNAMES


def _decode_extras(table, neutral=False):
    """seeds, positions, history, history_lengths, logit_bias, banned, eos_ids, generated, then the
    per-row parameters of `table`; neutral: processors that change nothing."""
    def extras(B, V):
        items = _fixed(np.arange(B) * 1000003 + 17) + _fixed(np.arange(B) * 5 + 3)  # seeds, positions
        if neutral:
            items += _fixed(np.zeros((B, 1))) + _fixed(np.zeros(B)) + _fixed(np.zeros(V))
            items += _fixed(np.full((B, 1), -1)) + _fixed([V]) + _fixed(np.full(B, 100))
        else:
            items += _history(B, V) + [((V,), None)]  # history, lengths, a random logit_bias
            items += _fixed(np.stack([np.arange(B) % V, np.full(B, V - 2)], 1))  # banned [B, 2]
            items += _fixed([1, V + 5]) + _fixed(np.arange(B) % 3)  # eos ids, generated
        return items + [p for n in _PNAMES for p in _fixed(_cycle(table[n][0], B))]
    return extras


def _decode_in_dtypes(dt):
    return (dt, "int64", "int64", "int32", "int32", "float32", "int32", "int32", "int32") + tuple(
        _PARAMS[n][1] for n in _PNAMES)


def _decode_fn(x, seeds, pos, hist, lens, bias, banned, eos, gen, *params):
    p = S.Params(**dict(zip(_PNAMES, params)))
    r = S.decode_step(x, p, seeds, pos, history=hist, history_lengths=lens, logit_bias=bias, banned=banned,
                      eos_ids=eos, generated=gen, return_logprobs=True, top_logprobs=TOP_N)
    return r.tokens, r.logprobs, r.top_ids, r.top_logprobs


def _decode_ref(x, seeds, pos, hist, lens, bias, banned, eos, gen, *params):
    P = {n: np.asarray(v, np.float64) for n, v in zip(_PNAMES, params)}
    r = _rows(x)
    B, V = r.shape
    h, L = _ints(hist), _ints(lens)
    toks, lps, tids, tlps = [], [], [], []
    for b in range(B):
        f32 = lambda n: float(np.float32(P[n][b]))  # noqa: E731
        v = (r[b] + np.asarray(bias, np.float32)).astype(np.float32)
        n = min(max(int(L[b]), 0), h.shape[1])
        v = sref.penalize(v, list(h[b, :n]), f32("repetition_penalty"), f32("presence_penalty"),
                          f32("frequency_penalty"))
        v[[i for i in _ints(banned)[b] if 0 <= i < V]] = -np.inf
        if _ints(gen)[b] < P["min_tokens"][b]:
            v[[i for i in _ints(eos) if 0 <= i < V]] = -np.inf
        T = np.float32(P["temperature"][b])
        s = v if T <= 0 else (v / T).astype(np.float32)
        if T <= 0:
            tok = int(np.argmax(s))
        else:
            k = int(P["top_k"][b])
            tok = sref.draw(s, int(_ints(seeds)[b]), int(_ints(pos)[b]), 0, top_k=k if 0 < k < V else None,
                            top_p=f32("top_p"), min_p=f32("min_p"), typical_p=f32("typical_p"))
        ls = s.astype(np.float64) - s.max()
        ls -= np.log(np.exp(ls).sum())
        order = np.argsort(-s.astype(np.float64), kind="stable")[:TOP_N]
        toks.append(tok)
        lps.append(ls[tok])
        tids.append(order)
        tlps.append(ls[order])
    return np.array(toks), np.array(lps), np.array(tids), np.array(tlps)


def _decode_greedy_fn(x, seeds, pos):
    return S.decode_step(x, {"temperature": 0.0, "top_p": 0.5}, seeds, pos).tokens


def _seeds_positions(B, V):
    return _fixed(np.arange(B) + 1) + _fixed(np.zeros(B))


DECODE_LAYOUTS = ("b3_v1023", "b2_v4097", "rows_strided", "cols_step2", "transposed", "offset")  # 2-d, V >= 33
LOGPROB_TOL = {"float32": (1e-5, 1e-5)}

OPS = [
    # ---- argmax / topk (ties -> lowest index) ----
    OpSpec("sampling.argmax", lambda x: S.argmax(x), _argmax_ref, dtypes=LOGITS, out_dtype=lambda dt: "int32",
           plan=_plan(), layouts=LAYOUTS, gen=_grid, exact=True, bitwise_cpu=True),
    OpSpec("sampling.argmax", lambda x: S.argmax(x), _argmax_ref, id="sampling.argmax_uniform", dtypes=("float32",),
           out_dtype=lambda dt: "int32", plan=_plan(), layouts=("b2_v4097", "transposed"), exact=True,
           bitwise_cpu=True),
    OpSpec("sampling.topk", lambda x: S.topk(x, _k(x)), lambda x: _topk_ref(x, _k(x)), dtypes=LOGITS,
           out_dtype=lambda dt: ("float32", "int32"), plan=_plan(), layouts=LAYOUTS, gen=_grid, exact=True,
           bitwise_cpu=True),
    OpSpec("sampling.topk", lambda x: S.topk(x, x.shape[-1]), lambda x: _topk_ref(x, x.shape[-1]),
           id="sampling.topk_full_sort", dtypes=("float32",), out_dtype=lambda dt: ("float32", "int32"),
           plan=_plan(), layouts=("v1", "row7", "rows_strided", "transposed"), exact=True, bitwise_cpu=True),
    # ---- processors (float32 results) ----
    OpSpec("sampling.apply_temperature", lambda x: S.apply_temperature(x, 0.7),
           lambda x: _like(_rows(x) / np.float32(0.7), x), dtypes=LOGITS, out_dtype=lambda dt: "float32",
           plan=_plan(), layouts=LAYOUTS, exact=True, bitwise_cpu=True),
    OpSpec("sampling.apply_penalties", lambda x, h, n: S.apply_penalties(x, h, n, REP, PRES, FREQ), _penalties_ref,
           nin=3, dtypes=LOGITS, in_dtypes=lambda dt: (dt, "int32", "int32"), out_dtype=lambda dt: "float32",
           plan=_plan(_history), layouts=LAYOUTS, exact=True, bitwise_cpu=True),
    # any parameters: the frequency product may be fused on CUDA (within a rounding)
    OpSpec("sampling.apply_penalties", lambda x, h, n: S.apply_penalties(x, h, n, 1.3, 0.3, 0.1),
           lambda x, h, n: _penalties_ref(x, h, n, 1.3, 0.3, 0.1), id="sampling.apply_penalties_any", nin=3,
           dtypes=("float32",), in_dtypes=lambda dt: (dt, "int32", "int32"), out_dtype=lambda dt: "float32",
           plan=_plan(_history), layouts=("b3_v1023", "rows_strided"), tol={"float32": (2e-7, 1e-7)}),
    OpSpec("sampling.apply_logit_bias", lambda x, b: S.apply_logit_bias(x, b), _bias_ref, nin=2, dtypes=LOGITS,
           in_dtypes=lambda dt: (dt, "float32"), out_dtype=lambda dt: "float32", plan=_plan(_bias_row),
           layouts=LAYOUTS, exact=True, bitwise_cpu=True),
    OpSpec("sampling.apply_logit_bias", lambda x, b: S.apply_logit_bias(x, b), _bias_ref,
           id="sampling.apply_logit_bias_rows", nin=2, dtypes=("float32", "bfloat16"),
           in_dtypes=lambda dt: (dt, "float32"), out_dtype=lambda dt: "float32", plan=_plan(_bias_rows),
           layouts=tuple(x for x in LAYOUTS if x != "row7"), exact=True, bitwise_cpu=True),
    OpSpec("sampling.ban_tokens", lambda x, i: S.ban_tokens(x, i), _ban_ref, nin=2, dtypes=LOGITS,
           in_dtypes=lambda dt: (dt, "int32"), out_dtype=lambda dt: "float32", plan=_plan(_banned_1d),
           layouts=LAYOUTS, exact=True, bitwise_cpu=True),
    OpSpec("sampling.ban_tokens", lambda x, i: S.ban_tokens(x, i), _ban_ref, id="sampling.ban_tokens_rows", nin=2,
           dtypes=("float32", "float16"), in_dtypes=lambda dt: (dt, "int32"), out_dtype=lambda dt: "float32",
           plan=_plan(_banned_2d), layouts=tuple(x for x in LAYOUTS if x != "row7"), exact=True, bitwise_cpu=True),
    OpSpec("sampling.apply_min_tokens", lambda x, e, g: S.apply_min_tokens(x, e, g, MIN_TOKENS), _min_tokens_ref,
           nin=3, dtypes=LOGITS, in_dtypes=lambda dt: (dt, "int32", "int32"), out_dtype=lambda dt: "float32",
           plan=_plan(_eos), layouts=LAYOUTS, exact=True, bitwise_cpu=True),
    # ---- filters: removed entries -inf, kept ones unchanged ----
    OpSpec("sampling.top_k_filter", lambda x: S.top_k_filter(x, _k(x)), lambda x: _filter_ref(top_k=_k(x))(x),
           dtypes=LOGITS, out_dtype=lambda dt: "float32", plan=_plan(), layouts=LAYOUTS, gen=_grid, exact=True,
           bitwise_cpu=True),
    OpSpec("sampling.top_p_filter", lambda x: S.top_p_filter(x, 0.9), _filter_ref(top_p=0.9), dtypes=LOGITS,
           out_dtype=lambda dt: "float32", plan=_plan(), layouts=LAYOUTS, gen=_grid, exact=True, bitwise_cpu=True),
    OpSpec("sampling.top_p_filter", lambda x: S.top_p_filter(x, 0.3), _filter_ref(top_p=0.3),
           id="sampling.top_p_filter_peaked", dtypes=("float32",), out_dtype=lambda dt: "float32", plan=_plan(),
           layouts=WIDE, gen=lambda rng, shape, dt, i: _grid(rng, shape, dt, i) * 4, exact=True, bitwise_cpu=True),
    OpSpec("sampling.min_p_filter", lambda x: S.min_p_filter(x, 0.3), _filter_ref(min_p=0.3), dtypes=LOGITS,
           out_dtype=lambda dt: "float32", plan=_plan(), layouts=LAYOUTS, gen=_grid, exact=True, bitwise_cpu=True),
    OpSpec("sampling.typical_p_filter", lambda x: S.typical_p_filter(x, 0.7), _filter_ref(typical_p=0.7),
           dtypes=LOGITS, out_dtype=lambda dt: "float32", plan=_plan(), layouts=LAYOUTS, gen=_grid, exact=True,
           bitwise_cpu=True),
    # ---- seeded draws ----
    OpSpec("sampling.sample", lambda x: S.sample(x, temperature=0.0, top_p=0.5, seed=4), _argmax_ref,
           id="sampling.sample_greedy", dtypes=LOGITS, out_dtype=lambda dt: "int32", plan=_plan(), layouts=LAYOUTS,
           gen=_grid, exact=True, bitwise_cpu=True),
    OpSpec("sampling.sample", lambda x: S.sample(x, temperature=0.8, top_p=0.95, seed=123, position=7), _argmax_ref,
           id="sampling.sample_peaked", dtypes=LOGITS, out_dtype=lambda dt: "int32", plan=_plan(), layouts=LAYOUTS,
           gen=_peaked, exact=True, bitwise_cpu=True),
    OpSpec("sampling.sample", lambda x: S.sample(x, top_k=_k(x), top_p=0.9, seed=99, position=5),
           lambda x: _draw_ref(99, 5, top_k=_k(x), top_p=0.9)(x), id="sampling.sample_reference_draw",
           dtypes=("float32", "bfloat16"), out_dtype=lambda dt: "int32", plan=_plan(), layouts=WIDE, gen=_grid,
           exact=True, bitwise_cpu=True),
    OpSpec("sampling.sample", lambda x: S.sample(x, seed=2 ** 40 + 1, position=3), _draw_ref(2 ** 40 + 1, 3),
           id="sampling.sample_reference_draw_plain", dtypes=("float32",), out_dtype=lambda dt: "int32",
           plan=_plan(), layouts=LAYOUTS, gen=_grid, exact=True, bitwise_cpu=True),
    # ---- the fused step: (tokens, logprobs, top ids, top logprobs) ----
    OpSpec("sampling.decode_step", _decode_fn, _decode_ref, nin=9 + len(_PNAMES), dtypes=LOGITS,
           in_dtypes=_decode_in_dtypes, out_dtype=lambda dt: ("int32", "float32", "int32", "float32"),
           plan=_plan(_decode_extras(_PARAMS)), layouts=DECODE_LAYOUTS, gen=_decode_gen,
           exact=(True, False, True, False), bitwise_cpu=(True, False, True, False), tol=LOGPROB_TOL),
    OpSpec("sampling.decode_step", _decode_fn, _decode_ref, id="sampling.decode_step_reference_draw",
           nin=9 + len(_PNAMES), dtypes=("float32", "bfloat16"), in_dtypes=_decode_in_dtypes,
           out_dtype=lambda dt: ("int32", "float32", "int32", "float32"),
           plan=_plan(_decode_extras(_DRAW_PARAMS, neutral=True)), layouts=DECODE_LAYOUTS, gen=_grid,
           exact=(True, False, True, False), bitwise_cpu=(True, False, True, False), tol=LOGPROB_TOL),
    OpSpec("sampling.decode_step", _decode_greedy_fn, lambda x, seeds, pos: _argmax_ref(x),
           id="sampling.decode_step_greedy_scalars", nin=3,
           dtypes=LOGITS, in_dtypes=lambda dt: (dt, "int64", "int64"), out_dtype=lambda dt: "int32",
           plan=_plan(_seeds_positions), layouts=tuple(x for x in LAYOUTS if x != "row7"), gen=_grid, exact=True,
           bitwise_cpu=True),
]
