"""Op-table entries of the fused inference ops, gk.nn (format: tests/python/harness.py).

The float64 references are those of the op-specific tests (test_norm.py, test_activation.py,
test_rope.py, test_kvcache.py, test_attention.py), imported rather than written twice; edge
cases, scalings and bad input live there.  Index inputs (positions, slot mappings, block tables,
sequence lengths) are fixed plan values, so on CUDA they are device-resident like in a decode
loop.  kv_append and rope(inplace=True) write into their inputs: their `fn` copies the
destination, runs the op on the copy and returns it, and the reference is the whole expected
destination (elements the op must not touch included).
"""

import ml_dtypes
import numpy as np

import gpukit as gk
from harness import OpSpec, same_dtype as _same
from test_activation import ref as act_ref
from test_attention import ref_decode, ref_prefill
from test_kvcache import paged_ref
from test_norm import ln_ref, rms_ref
from test_rope import rope_ref

NN = ("float32", "float16", "bfloat16")
_NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}

# (rtol, atol): fp64 CPU math and fp32 CUDA math, each rounded once to the storage dtype, so the
# CUDA-vs-CPU comparisons (same tolerance) allow one ulp of the narrow types.
NORM_TOL = {"float32": (2e-5, 2e-5), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2)}
ROPE_TOL = {"float32": (1e-5, 3e-6), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2)}
ATT_TOL = {"float32": (2e-5, 2e-5), "float16": (4e-3, 4e-3), "bfloat16": (3.2e-2, 3.2e-2)}


def _round(v, dt):
    """float64 values rounded once to dtype `dt` (what the op stores)."""
    return np.asarray(v, np.float64).astype(_NP[dt]).astype(np.float64)


def _ints(a):
    return np.asarray(a).astype(np.int64)


def _view(fn):
    """A custom view that is the same expression on gk.Arrays and NumPy arrays."""
    return (fn, fn)


# ---------------------------------------------------------------- norms
# layout -> ((base shape, view), H): x is [..., H]; the leading dims may be strided, and the
# last one may be too (the op copies it).
_ROWS = {
    "h1": (((1, 1), None), 1),
    "1d": (((33,), None), 33),
    "odd": (((7, 33), None), 33),
    "wide": (((3, 4097), None), 4097),
    "3d": (((2, 5, 64), None), 64),
    "rows_step2": (((9, 40), "step2"), 40),
    "last_strided": (((6, 80), "cols_step2"), 40),
    "offset": (((8, 33), "offset1"), 33),
    "transposed": (((33, 6), "T"), 33),
    "empty": (((0, 16), None), 16),
}
ROWS = tuple(_ROWS)


def _rows_plan(n_rows, n_vecs):
    """n_rows inputs with x's layout, then n_vecs [H] parameters (reversed views in one layout)."""
    def plan(layout):
        if layout not in _ROWS:
            return None
        item, H = _ROWS[layout]
        return [item] * n_rows + [((H,), "rev" if layout == "transposed" else None)] * n_vecs
    return plan


def _shifted(rng, shape, dtype, index):
    """x with a large mean (a one-pass variance would lose digits); parameters around 1."""
    return rng.uniform(2, 8, size=shape) if index == 0 else rng.uniform(-1.5, 1.5, size=shape)


def _rms_residual_ref(x, r, w, dtype):
    nr = _round(x + r, dtype)  # the new residual: x + residual rounded once to the storage dtype
    return rms_ref(nr, w, 1e-6), nr


# ---------------------------------------------------------------- gated activations
ACT_LAYOUTS = ("size1", "size7", "size1023", "size4097", "scalar0d", "2d", "transposed", "stepped", "reversed",
               "offset", "empty", "empty3d")

_FUSED = {
    "pair1": ((1, 2), None),
    "odd": ((7, 66), None),
    "wide": ((3, 8194), None),
    "3d": ((2, 3, 128), None),
    "rows_step2": ((9, 66), "step2"),
    "offset": ((8, 66), "offset1"),
    "transposed": ((66, 5), "T"),
    "empty": ((0, 8), None),
}


def _fused_plan(layout):
    return [_FUSED[layout]] if layout in _FUSED else None


def _act(act, g, u):
    """test_activation.ref, also on empty arrays (its vectorized erf needs at least one element)."""
    return act_ref(act, g, u) if g.size else np.zeros(g.shape)


def _fused_ref(act):
    def ref(x):
        i = x.shape[-1] // 2
        return _act(act, x[..., :i], x[..., i:])
    return ref


def _act_entries():
    calls = {"swiglu": lambda *a: gk.nn.swiglu(*a), "geglu": lambda *a: gk.nn.geglu(*a),
             "geglu_tanh": lambda *a: gk.nn.geglu(*a, approximate="tanh")}
    out = []
    for name, call in calls.items():
        out.append(OpSpec(name, lambda g, u, call=call: call(g, u), lambda g, u, name=name: _act(name, g, u),
                          nin=2, dtypes=NN, out_dtype=_same, layouts=ACT_LAYOUTS, low=-6, high=6))
        out.append(OpSpec(name, lambda x, call=call: call(x), _fused_ref(name), id=f"{name}_fused", dtypes=NN,
                          out_dtype=_same, plan=_fused_plan, layouts=tuple(_FUSED), low=-6, high=6))
    out.append(OpSpec("relu2", lambda x: gk.nn.relu2(x), lambda x: act_ref("relu2", x, None), dtypes=NN,
                      out_dtype=_same, layouts=ACT_LAYOUTS))
    return out


# ---------------------------------------------------------------- rope
# layout -> (T, Hq, Hkv, D, q view, k view); q/k views of a fused [T, Hq + 2 Hkv, D] buffer are
# strided in the head dimension.
def _heads(lo, hi):
    return _view(lambda a: a[:, lo:hi])


_ROPE = {
    "t1_d2": (1, 1, 1, 2, None, None),
    "odd": (7, 3, 1, 6, None, None),
    "gqa_d64": (5, 8, 2, 64, None, None),
    "d80": (9, 2, 2, 80, None, None),
    "qkv_views": (6, 4, 2, 64, "qkv", "qkv"),
    "heads_step2": (4, 3, 2, 32, "step", "step"),
    "empty": (0, 2, 1, 16, None, None),
}


def _rope_item(T, H, D, view, which, Hq, Hkv):
    if view == "qkv":  # q = buf[:, :Hq], k = buf[:, Hq:Hq + Hkv] of [T, Hq + 2 Hkv, D] buffers
        return ((T, Hq + 2 * Hkv, D), _heads(0, Hq) if which == "q" else _heads(Hq, Hq + Hkv))
    if view == "step":
        return ((T, 2 * H, D), _view(lambda a: a[:, ::2]))
    return ((T, H, D), None)


def _positions(T, big=False):
    r = np.random.default_rng(1000 + T)
    return r.integers(0, 131072 if big else 5000, size=T)


def _rope_plan(with_k, big_positions=False):
    def plan(layout):
        if layout not in _ROPE:
            return None
        T, Hq, Hkv, D, qv, kv = _ROPE[layout]
        items = [_rope_item(T, Hq, D, qv, "q", Hq, Hkv)]
        if with_k:
            items.append(_rope_item(T, Hkv, D, kv, "k", Hq, Hkv))
        return items + [((T,), None, _positions(T, big_positions))]
    return plan


def _rd(D):
    """A partial rotary dim for head dim D (even, at least 2)."""
    return max(2, D // 4 * 2)


def _rope_inplace(qkv, pos, hq, hkv):
    buf = qkv.copy()
    gk.nn.rope(buf[:, :hq], buf[:, hq:hq + hkv], pos, inplace=True)
    return buf


def _rope_inplace_ref(qkv, pos, hq, hkv):
    out = qkv.copy()
    D = qkv.shape[-1]
    out[:, :hq] = rope_ref(qkv[:, :hq], _ints(pos), 1e4, D, False)
    out[:, hq:hq + hkv] = rope_ref(qkv[:, hq:hq + hkv], _ints(pos), 1e4, D, False)
    return out


_INPLACE = {"odd": (7, 3, 1, 6), "gqa_d64": (5, 8, 2, 64), "t1": (1, 1, 1, 2)}  # T, Hq, Hkv, D


def _inplace_plan(layout):
    if layout not in _INPLACE:
        return None
    T, Hq, Hkv, D = _INPLACE[layout]
    return [((T, Hq + 2 * Hkv, D), None), ((T,), None, _positions(T))]


_YARN = {"type": "yarn", "factor": 4.0, "original_max_position": 4096}


def _rope_entries():
    lay = tuple(_ROPE)
    pos32 = lambda dt: (dt, dt, "int32")  # noqa: E731
    return [
        OpSpec("rope", lambda q, k, p: gk.nn.rope(q, k, p), lambda q, k, p: (rope_ref(q, _ints(p), 1e4, q.shape[-1],
               False), rope_ref(k, _ints(p), 1e4, k.shape[-1], False)), nin=3, dtypes=NN, in_dtypes=pos32,
               out_dtype=_same, plan=_rope_plan(True), layouts=lay, tol=ROPE_TOL),
        OpSpec("rope", lambda q, k, p: gk.nn.rope(q, k, p, rotary_dim=_rd(q.shape[-1]), interleaved=True,
                                                  theta=5e5),
               lambda q, k, p: (rope_ref(q, _ints(p), 5e5, _rd(q.shape[-1]), True),
                                rope_ref(k, _ints(p), 5e5, _rd(k.shape[-1]), True)),
               id="rope_interleaved_partial", nin=3, dtypes=NN, in_dtypes=lambda dt: (dt, dt, "int64"),
               out_dtype=_same, plan=_rope_plan(True), layouts=lay, tol=ROPE_TOL),
        OpSpec("rope", lambda q, p: gk.nn.rope(q, None, p, theta=5e5, scaling=_YARN)[0],
               lambda q, p: rope_ref(q, _ints(p), 5e5, q.shape[-1], False, _YARN), id="rope_yarn_q_only", nin=2,
               dtypes=NN, in_dtypes=lambda dt: (dt, "int64"), out_dtype=_same,
               plan=_rope_plan(False, big_positions=True), layouts=lay, tol=ROPE_TOL),
        OpSpec("rope", lambda b, p: _rope_inplace(b, p, *_INPLACE_HEADS[b.shape[1]]),
               lambda b, p: _rope_inplace_ref(b, p, *_INPLACE_HEADS[b.shape[1]]), id="rope_inplace", nin=2,
               dtypes=NN, in_dtypes=lambda dt: (dt, "int32"), out_dtype=_same, plan=_inplace_plan,
               layouts=tuple(_INPLACE), tol=ROPE_TOL),
    ]


# the in-place layouts have distinct buffer widths Hq + 2 Hkv: width -> (Hq, Hkv)
_INPLACE_HEADS = {hq + 2 * hkv: (hq, hkv) for _, hq, hkv, _ in _INPLACE.values()}
assert len(_INPLACE_HEADS) == len(_INPLACE)


# ---------------------------------------------------------------- ALiBi and sinusoidal positions
def _sin_ref(p, dim):
    inv = (1.0 / 10000 ** (np.arange(0, dim, 2) / dim)).astype(np.float32)
    ang = (_ints(p).astype(np.float32)[:, None] * inv[None]).astype(np.float64)  # the fp32 angle
    out = np.empty((p.shape[0], dim))
    out[:, 0::2], out[:, 1::2] = np.sin(ang), np.cos(ang)
    return out


_POS = {"t1": ((1,), None), "t7": ((7,), None), "t300": ((300,), None), "step2": ((15,), "step2"),
        "rev": ((9,), "rev"), "empty": ((0,), None)}


def _pos_gen(rng, shape, dtype, index):
    return rng.integers(0, 65536, size=shape)


_SLOPES = {"h1": ((1,), None), "h12": ((12,), None), "h5_step2": ((10,), "step2"), "h3_rev": ((3,), "rev")}


def _alibi_ref(s, q, k):
    i, j = np.arange(q)[:, None], np.arange(k)[None, :]
    return s[:, None, None] * (j - (i + k - q))[None]


def _position_entries():
    out = []
    for dt in NN:  # the output dtype is an argument: one entry per dtype
        for dim in (6, 64, 1024):
            out.append(OpSpec("sinusoidal_positions", lambda p, dim=dim, dt=dt: gk.nn.sinusoidal_positions(p, dim, dt),
                              lambda p, dim=dim: _sin_ref(p, dim), id=f"sinusoidal_positions_d{dim}", dtypes=(dt,),
                              in_dtypes=lambda _, dim=dim: ("int32" if dim != 64 else "int64",),
                              out_dtype=_same, gen=_pos_gen, plan=lambda lay: [_POS[lay]] if lay in _POS else None,
                              layouts=tuple(_POS)))
        for q, k in ((7, 9), (1, 4097), (5, 5), (0, 3)):
            out.append(OpSpec("alibi_bias", lambda s, q=q, k=k, dt=dt: gk.nn.alibi_bias(s, q, k, dtype=dt),
                              lambda s, q=q, k=k: _alibi_ref(s, q, k), id=f"alibi_bias_q{q}_k{k}", dtypes=(dt,),
                              in_dtypes=lambda _: ("float32",), out_dtype=_same, low=0.0, high=1.0,
                              plan=lambda lay: [_SLOPES[lay]] if lay in _SLOPES else None, layouts=tuple(_SLOPES)))
    return out


# ---------------------------------------------------------------- kv_append
def _kv_copy_append(k, v, kc, vc, **index):
    kc2, vc2 = kc.copy(), vc.copy()
    gk.nn.kv_append(k, v, kc2, vc2, **index)
    return kc2, vc2


def _kv_split(a):
    return _view(lambda x: x[:, :a]), _view(lambda x: x[:, a:])


# slot mapping: layout -> (T, H, D, num_blocks, block_size, slots (-1 skips), fused k/v views)
_SLOT = {
    "t7_d5": (7, 3, 5, 3, 16, [0, 17, -1, 47, 33, 5, 46], False),
    "t1": (1, 1, 1, 1, 16, [15], False),
    "kv_views": (6, 2, 8, 2, 32, [63, 0, 1, 32, -1, 2], True),
    "empty": (0, 2, 4, 1, 16, np.zeros(0), False),
}


def _slot_plan(layout):
    if layout not in _SLOT:
        return None
    T, H, D, nb, bs, slots, views = _SLOT[layout]
    if views:  # k_new, v_new: the halves of fused [T, 2H, D] buffers (strided)
        kvs = [((T, 2 * H, D), _kv_split(H)[0]), ((T, 2 * H, D), _kv_split(H)[1])]
    else:
        kvs = [((T, H, D), None)] * 2
    return kvs + [((nb, bs, H, D), None)] * 2 + [((T,), None, np.asarray(slots, np.float64))]


def _slot_ref(k, v, kc, vc, slots, k_scale=None, v_scale=None):
    outs = []
    for new, cache, scale in ((k, kc, k_scale), (v, vc, v_scale)):
        flat = cache.reshape(-1, *cache.shape[2:]).copy()
        for t, s in enumerate(_ints(slots)):
            if s >= 0:
                flat[s] = new[t] if scale is None else _fp8(new[t] / scale[:, None])
        outs.append(flat.reshape(cache.shape))
    return tuple(outs)


def _fp8(v):
    return np.asarray(v, np.float64).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)


# paged: layout -> (H, D, num_blocks, block_size, block_table, seq_lens before, new tokens per sequence)
_PAGED = {
    "bs16": (3, 16, 9, 16, [[4, 0, 1], [2, 3, 0], [7, 8, 1], [5, 6, 6]], [0, 15, 19, 2], [3, 2, 1, 0]),
    "bs32_d6": (2, 6, 6, 32, [[5, 1], [0, 2], [3, 4]], [31, 0, 40], [2, 33, 1]),
}


def _paged_plan(layout):
    if layout not in _PAGED:
        return None
    H, D, nb, bs, bt, lens, n_new = _PAGED[layout]
    cu = np.concatenate([[0], np.cumsum(n_new)])
    T = int(cu[-1])
    return [((T, H, D), None)] * 2 + [((nb, bs, H, D), None)] * 2 + [
        (np.shape(bt), None, np.asarray(bt, np.float64)), ((len(lens),), None, np.asarray(lens, np.float64)),
        ((len(cu),), None, cu.astype(np.float64))]


def _paged_ref(k, v, kc, vc, bt, lens, cu):
    return (paged_ref(kc, k, _ints(bt), _ints(lens), _ints(cu)), paged_ref(vc, v, _ints(bt), _ints(lens), _ints(cu)))


# contiguous decode cache [B, T_max, H, D], one new token per sequence: layout -> (T_max, H, D, seq_lens)
_CONTIG = {"b3": (10, 2, 4, [0, 9, 4]), "b1": (1, 1, 3, [0]), "b5_d7": (6, 3, 7, [5, 0, 1, 2, 3])}


def _contig_plan(layout):
    if layout not in _CONTIG:
        return None
    Tm, H, D, lens = _CONTIG[layout]
    B = len(lens)
    return [((B, H, D), None)] * 2 + [((B, Tm, H, D), None)] * 2 + [((B,), None, np.asarray(lens, np.float64))]


def _contig_ref(k, v, kc, vc, lens):
    outs = []
    for new, cache in ((k, kc), (v, vc)):
        c = cache.copy()
        for b, L in enumerate(_ints(lens)):
            c[b, L] = new[b]
        outs.append(c)
    return tuple(outs)


# fp8-e4m3 cache with per-head scales: powers of two, so x / scale is exact and the one rounding
# to fp8 is the same in every implementation (values stay far below the fp8 maximum, 448).
_FP8_SCALES = {"t7_d5": [0.25, 2.0, 1 / 64], "t1": [0.5], "kv_views": [4.0, 0.125]}


def _fp8_plan(layout):
    if layout not in _FP8_SCALES:
        return None
    s = np.asarray(_FP8_SCALES[layout], np.float64)
    return _slot_plan(layout) + [(s.shape, None, s), (s.shape, None, s[::-1].copy())]


# kv_append fused with RoPE on k (rotation at each token's cache position): _PAGED layout -> rope options
_KV_ROPE = {"bs16": {"theta": 500.0}, "bs32_d6": {"rotary_dim": 4, "interleaved": True}}


def _kv_rope_ref(k, v, kc, vc, bt, lens, cu, dtype, kw):
    bt, lens, cu = _ints(bt), _ints(lens), _ints(cu)
    pos = np.concatenate([np.arange(lens[b], lens[b] + cu[b + 1] - cu[b]) for b in range(len(lens))] + [[]])
    kr = _round(rope_ref(k, pos.astype(np.int64), kw.get("theta", 10000.0), kw.get("rotary_dim", k.shape[-1]),
                         kw.get("interleaved", False)), dtype)
    return paged_ref(kc, kr, bt, lens, cu), paged_ref(vc, v, bt, lens, cu)


def _kv_entries():
    idx = lambda dt: (dt,) * 4 + ("int64",)  # noqa: E731
    rope = [OpSpec("kv_append", lambda k, v, kc, vc, bt, sl, cu, kw=kw: _kv_copy_append(
                       k, v, kc, vc, block_table=bt, seq_lens=sl, cu_seqlens=cu, rope=True, **kw),
                   lambda *a, dtype, kw=kw: _kv_rope_ref(*a, dtype, kw), id=f"kv_append_rope_{lay}", nin=7,
                   dtypes=NN, in_dtypes=lambda dt: (dt,) * 4 + ("int32",) * 3, out_dtype=_same,
                   plan=lambda L, lay=lay: _paged_plan(L) if L == lay else None, layouts=(lay,), ref_dtype=True,
                   tol=ROPE_TOL) for lay, kw in _KV_ROPE.items()]
    return rope + [
        OpSpec("kv_append", lambda k, v, kc, vc, s: _kv_copy_append(k, v, kc, vc, slot_mapping=s), _slot_ref,
               id="kv_append_slot_mapping", nin=5, dtypes=NN, in_dtypes=idx, out_dtype=_same, plan=_slot_plan,
               layouts=tuple(_SLOT), exact=True, bitwise_cpu=True),
        OpSpec("kv_append", lambda k, v, kc, vc, s: _kv_copy_append(k, v, kc, vc, slot_mapping=s), _slot_ref,
               id="kv_append_slot_mapping_int32", nin=5, dtypes=("bfloat16",),
               in_dtypes=lambda dt: (dt,) * 4 + ("int32",), out_dtype=_same, plan=_slot_plan,
               layouts=("t7_d5",), exact=True, bitwise_cpu=True),
        OpSpec("kv_append", lambda k, v, kc, vc, bt, sl, cu: _kv_copy_append(k, v, kc, vc, block_table=bt,
                                                                             seq_lens=sl, cu_seqlens=cu),
               _paged_ref, id="kv_append_paged", nin=7, dtypes=NN, in_dtypes=lambda dt: (dt,) * 4 + ("int32",) * 3,
               out_dtype=_same, plan=_paged_plan, layouts=tuple(_PAGED), exact=True, bitwise_cpu=True),
        OpSpec("kv_append", lambda k, v, kc, vc, sl: _kv_copy_append(k, v, kc, vc, seq_lens=sl), _contig_ref,
               id="kv_append_contiguous", nin=5, dtypes=NN, in_dtypes=lambda dt: (dt,) * 4 + ("int32",),
               out_dtype=_same, plan=_contig_plan, layouts=tuple(_CONTIG), exact=True, bitwise_cpu=True),
        OpSpec("kv_append", lambda k, v, kc, vc, s, ks, vs: _kv_copy_append(k, v, kc, vc, slot_mapping=s,
                                                                            k_scale=ks, v_scale=vs),
               lambda k, v, kc, vc, s, ks, vs: _slot_ref(k, v, kc, vc, s, ks, vs), id="kv_append_fp8", nin=7,
               dtypes=NN, in_dtypes=lambda dt: (dt, dt, "float8_e4m3fn", "float8_e4m3fn", "int64", "float32",
                                                "float32"),
               out_dtype=lambda dt: "float8_e4m3fn", plan=_fp8_plan, layouts=tuple(_FP8_SCALES), exact=True,
               bitwise_cpu=True),
    ]


# ---------------------------------------------------------------- attention
def _block_table(B, maxb, nb, seed):
    return np.random.default_rng(seed).permutation(nb)[: B * maxb].reshape(B, maxb).astype(np.float64)


# paged decode: layout -> (Hq, Hkv, D, block_size, seq_lens, q view); the pool has 3 spare blocks
_DECODE = {
    "gqa_d64": (6, 2, 64, 16, [1, 37, 0, 50], None),
    "mha_d128": (2, 2, 128, 32, [33, 64, 5], None),
    "mqa_d256": (3, 1, 256, 16, [17, 3], None),
    "long_chunks": (4, 2, 64, 64, [300, 513], None),   # several 64-token CUDA chunks
    "chunk128": (4, 1, 64, 64, [2100, 64], None),      # 128-token chunks (over 32 chunks of 64), one-chunk sequence
    "q_strided": (4, 2, 64, 16, [20, 5], "step"),     # q [:, ::2] of [B, 2 Hq, D]
}


def _decode_plan(layout, fp8=False):
    if layout not in _DECODE:
        return None
    Hq, Hkv, D, bs, lens, qv = _DECODE[layout]
    B = len(lens)
    maxb = max(1, max((L + bs - 1) // bs for L in lens))
    nb = B * maxb + 3
    q = ((B, 2 * Hq, D), _view(lambda a: a[:, ::2])) if qv else ((B, Hq, D), None)
    items = [q, ((nb, bs, Hkv, D), None), ((nb, bs, Hkv, D), None),
             ((B,), None, np.asarray(lens, np.float64)), ((B, maxb), None, _block_table(B, maxb, nb, B + D))]
    if fp8:
        s = np.linspace(0.25, 1.5, Hkv)
        items += [((Hkv,), None, s), ((Hkv,), None, s[::-1].copy())]
    return items


# contiguous cache [B, T_max, Hkv, D]: layout -> (Hq, Hkv, D, T_max, seq_lens)
_CDECODE = {"b3_t50": (8, 2, 64, 50, [50, 7, 33]), "b2_t300": (4, 4, 128, 300, [300, 1])}


def _cdecode_plan(layout):
    if layout not in _CDECODE:
        return None
    Hq, Hkv, D, Tm, lens = _CDECODE[layout]
    B = len(lens)
    return [((B, Hq, D), None), ((B, Tm, Hkv, D), None), ((B, Tm, Hkv, D), None),
            ((B,), None, np.asarray(lens, np.float64))]


# prefill: layout -> (Hq, Hkv, D, cu_seqlens_q, cu_seqlens_k, q view)
_PREFILL = {
    "varlen_gqa_d64": (4, 2, 64, [0, 5, 5, 12, 13], [0, 5, 9, 20, 21], None),  # empty and cached-prefix sequences
    "mha_d128": (2, 2, 128, [0, 3, 10], [0, 3, 10], None),
    "mqa_d256": (2, 1, 256, [0, 4], [0, 6], None),
    "long_q_strided": (2, 1, 64, [0, 260, 263], [0, 270, 280], "step"),  # past one 256-key chunk
}


def _prefill_plan(layout):
    if layout not in _PREFILL:
        return None
    Hq, Hkv, D, cuq, cuk, qv = _PREFILL[layout]
    Tq, Tk = cuq[-1], cuk[-1]
    q = ((Tq, 2 * Hq, D), _view(lambda a: a[:, ::2])) if qv else ((Tq, Hq, D), None)
    return [q, ((Tk, Hkv, D), None), ((Tk, Hkv, D), None), ((len(cuq),), None, np.asarray(cuq, np.float64)),
            ((len(cuk),), None, np.asarray(cuk, np.float64))]


# one sequence, no cu_seqlens: layout -> (Tq, Tk, Hq, Hkv, D)
_PREFILL1 = {"t9": (9, 9, 4, 2, 64), "t1": (1, 1, 1, 1, 64), "q3_k300": (3, 300, 2, 2, 128)}


def _prefill1_plan(layout):
    if layout not in _PREFILL1:
        return None
    Tq, Tk, Hq, Hkv, D = _PREFILL1[layout]
    return [((Tq, Hq, D), None), ((Tk, Hkv, D), None), ((Tk, Hkv, D), None)]


def _one_seq(q, k):
    return np.array([0, q.shape[0]]), np.array([0, k.shape[0]])


def _attention_entries():
    i32 = lambda n: (lambda dt: (dt,) * 3 + ("int32",) * n)  # noqa: E731
    out = [
        OpSpec("attention_decode", lambda q, kc, vc, sl, bt: gk.nn.attention_decode(q, kc, vc, sl, block_table=bt),
               lambda q, kc, vc, sl, bt: ref_decode(q, kc, vc, _ints(sl), _ints(bt)), id="attention_decode_paged",
               nin=5, dtypes=NN, in_dtypes=i32(2), out_dtype=_same, plan=_decode_plan, layouts=tuple(_DECODE),
               tol=ATT_TOL),
        OpSpec("attention_decode", lambda q, kc, vc, sl, bt, ks, vs: gk.nn.attention_decode(
               q, kc, vc, sl, block_table=bt, k_scale=ks, v_scale=vs),
               lambda q, kc, vc, sl, bt, ks, vs: ref_decode(q, kc * ks[None, None, :, None],
                                                            vc * vs[None, None, :, None], _ints(sl), _ints(bt)),
               id="attention_decode_fp8", nin=7, dtypes=NN,
               in_dtypes=lambda dt: (dt, "float8_e4m3fn", "float8_e4m3fn", "int32", "int32", "float32", "float32"),
               out_dtype=_same, plan=lambda lay: _decode_plan(lay, fp8=True),
               layouts=("gqa_d64", "long_chunks", "q_strided"), tol=ATT_TOL),
    ]
    for kw in ({}, {"window": 10, "softcap": 5.0}, {"scale": 0.3, "window": 1}):
        name = "_".join(f"{a}{b}" for a, b in kw.items())
        out.append(OpSpec("attention_decode", lambda q, kc, vc, sl, kw=kw: gk.nn.attention_decode(q, kc, vc, sl, **kw),
                          lambda q, kc, vc, sl, kw=kw: ref_decode(q, kc, vc, _ints(sl), **kw),
                          id="attention_decode_contiguous" + (f"_{name}" if name else ""), nin=4, dtypes=NN,
                          in_dtypes=i32(1), out_dtype=_same, plan=_cdecode_plan, layouts=tuple(_CDECODE),
                          tol=ATT_TOL))
    for causal in (True, False):
        out.append(OpSpec("attention_prefill", lambda q, k, v, cq, ck, c=causal: gk.nn.attention_prefill(
                              q, k, v, cq, ck, causal=c),
                          lambda q, k, v, cq, ck, c=causal: ref_prefill(q, k, v, _ints(cq), _ints(ck), c),
                          id=f"attention_prefill_varlen_{'causal' if causal else 'full'}", nin=5, dtypes=NN,
                          in_dtypes=i32(2), out_dtype=_same, plan=_prefill_plan, layouts=tuple(_PREFILL),
                          tol=ATT_TOL))
    for kw in ({}, {"window": 3, "softcap": 2.0}, {"scale": 0.5, "causal": False}):
        name = "_".join(f"{a}{b}" for a, b in kw.items())
        out.append(OpSpec("attention_prefill", lambda q, k, v, kw=kw: gk.nn.attention_prefill(q, k, v, **kw),
                          lambda q, k, v, kw=kw: ref_prefill(q, k, v, *_one_seq(q, k), **kw),
                          id="attention_prefill_single" + (f"_{name}" if name else ""), nin=3, dtypes=NN,
                          out_dtype=_same, plan=_prefill1_plan, layouts=tuple(_PREFILL1), tol=ATT_TOL))
    return out


OPS = [
    # ---- norms ----
    OpSpec("rms_norm", lambda x, w: gk.nn.rms_norm(x, w, eps=1e-5), lambda x, w: rms_ref(x, w, 1e-5), nin=2,
           dtypes=NN, out_dtype=_same, plan=_rows_plan(1, 1), layouts=ROWS, tol=NORM_TOL),
    OpSpec("rms_norm", lambda x, w: gk.nn.rms_norm(x, w, eps=1e-6, gemma=True),
           lambda x, w: rms_ref(x, w, 1e-6, gemma=True), id="rms_norm_gemma", nin=2, dtypes=NN, out_dtype=_same,
           plan=_rows_plan(1, 1), layouts=("odd", "wide", "rows_step2", "transposed"), tol=NORM_TOL),
    # (y, new residual); the residual sum is rounded to the storage dtype and must match exactly
    OpSpec("rms_norm_residual", lambda x, r, w: gk.nn.rms_norm(x, w, eps=1e-6, residual=r), _rms_residual_ref,
           nin=3, dtypes=NN, out_dtype=_same, plan=_rows_plan(2, 1), layouts=ROWS, tol=NORM_TOL, ref_dtype=True,
           exact=(False, True), bitwise_cpu=(False, True)),
    OpSpec("layer_norm", lambda x, w, b: gk.nn.layer_norm(x, w, b, eps=1e-5), lambda x, w, b: ln_ref(x, w, b, 1e-5),
           nin=3, dtypes=NN, out_dtype=_same, plan=_rows_plan(1, 2), layouts=ROWS, gen=_shifted, tol=NORM_TOL),
    OpSpec("layer_norm", lambda x, w: gk.nn.layer_norm(x, w), lambda x, w: ln_ref(x, w, None, 1e-5),
           id="layer_norm_no_bias", nin=2, dtypes=NN, out_dtype=_same, plan=_rows_plan(1, 1),
           layouts=("h1", "odd", "wide", "last_strided", "transposed"), gen=_shifted, tol=NORM_TOL),
] + _act_entries() + _rope_entries() + _position_entries() + _kv_entries() + _attention_entries()
