"""The fused decode attention of src/cuda/llm_attention.cu (fused_attention_rope: RoPE + KV
append + decode attention in one launch) against float64 NumPy and the composed kernels,
and its engine options (fused_attention, _trigger, _chunk, _cluster, _auto, max_keys):
the same bits wherever an option only moves work. CUDA parts skip without a GPU."""
import math

import numpy as np
import pytest

import gpukit as gk
from gpukit import _C

from test_gemv import NP_DT, f64
from test_llm_step import CFG, CFG128, arr, cuda_only, first_bad, np_of, run, same


# ---- attention_rope: RoPE + KV append + decode attention in one launch ----

def attn_case(dtype, B, hq, hkv, D, bs, nb, max_blocks, positions, rd=None, il=False, bad=None, seed=0):
    rng = np.random.default_rng(seed)
    n = (hq + 2 * hkv) * D
    qkv = (rng.standard_normal((B, n))).astype(NP_DT[dtype])
    assert B * max_blocks <= nb
    bt = rng.permutation(nb)[:B * max_blocks].reshape(B, max_blocks).astype(np.int32)  # disjoint pages
    if bad is not None:  # sequence `bad`'s new token: page outside the pool (not stored, masked)
        bt[bad, positions[bad] // bs] = nb + 5
    kc = (rng.standard_normal((nb, bs, hkv, D))).astype(NP_DT[dtype])
    vc = (rng.standard_normal((nb, bs, hkv, D))).astype(NP_DT[dtype])
    pos = np.asarray(positions, np.int32)
    return qkv, kc, vc, pos, bt


def run_attn_fused(case, hq, rd=None, il=False, chunk=128):
    qkv, kc, vc, pos, bt = case
    k, v = arr(kc.copy(), "cuda"), arr(vc.copy(), "cuda")
    out, ctr = _C.llm.fused_attention_rope(arr(qkv, "cuda"), hq, k, v, arr(pos, "cuda"), arr(bt, "cuda"),
                                           theta=10000.0, rotary_dim=rd, interleaved=il, chunk=chunk)
    return np_of(out), np_of(k), np_of(v), np_of(ctr)


def ref_attention(q, kc, vc, pos, bt):
    """float64 attention of the rotated q over the cached keys 0 .. pos (pages outside the
    pool or past the table skipped)."""
    B, hq, D = q.shape
    nb, bs, hkv, _ = kc.shape
    G = hq // hkv
    K, V = f64(kc).reshape(-1, hkv, D), f64(vc).reshape(-1, hkv, D)
    out = np.zeros((B, hq, D))
    for b in range(B):
        L = min(int(pos[b]) + 1, bt.shape[1] * bs)
        idx = [int(bt[b, p // bs]) * bs + p % bs for p in range(L) if 0 <= bt[b, p // bs] < nb]
        if not idx:
            continue
        for h in range(hq):
            sc = K[idx, h // G] @ f64(q[b, h]) / math.sqrt(D)
            pr = np.exp(sc - sc.max())
            out[b, h] = pr @ V[idx, h // G] / pr.sum()
    return out


def check_attention(out, ro, q, kc, vc, pos, bt, dtype):
    """The fused kernel within output rounding of the float64 attention; the two-launch
    composition (its P rounded to the cache type) printed beside it."""
    ref = ref_attention(q, kc, vc, pos, bt)
    eps = 2.0**-8 if dtype == "bfloat16" else 2.0**-11
    vmax = float(np.max(np.abs(f64(vc))))
    msg = first_bad(f64(out), ref, eps * np.abs(ref) + 2e-5 * vmax)
    dev = float(np.max(np.abs(f64(ro) - ref)))
    print(f"\nmax |fused - f64| {float(np.max(np.abs(f64(out) - ref))):.3g}, |composition - f64| {dev:.3g}")
    assert msg is None, msg
    assert dev <= 2.0**-6 * vmax, f"the composition itself is off by {dev}"


def run_attn_composed(case, hq, rd=None, il=False):
    qkv, kc, vc, pos, bt = case
    B = qkv.shape[0]
    hkv, D = kc.shape[2], kc.shape[3]
    Q, KV = hq * D, hkv * D
    k, v = arr(kc.copy(), "cuda"), arr(vc.copy(), "cuda")
    q2 = arr(np.ascontiguousarray(qkv[:, :Q]).reshape(B, hq, D), "cuda")
    k2 = arr(np.ascontiguousarray(qkv[:, Q:Q + KV]).reshape(B, hkv, D), "cuda")
    v2 = arr(np.ascontiguousarray(qkv[:, Q + KV:]).reshape(B, hkv, D), "cuda")
    _C.llm.fused_rope_append(q2, k2, v2, k, v, arr(pos, "cuda"), arr(bt, "cuda"), rotary_dim=rd, interleaved=il)
    out = gk.nn.attention_decode(q2, k, v, arr(pos + 1, "cuda"), arr(bt, "cuda"))
    return np_of(out), np_of(k), np_of(v), np_of(q2)


@cuda_only
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("B,hq,hkv,D,positions", [
    (1, 32, 8, 128, [0]), (1, 32, 8, 128, [127]), (1, 32, 8, 128, [128]), (1, 32, 8, 128, [383]),
    (3, 8, 8, 64, [5, 200, 1000]), (2, 16, 2, 64, [130, 17]), (8, 8, 1, 128, [1, 2, 3, 300, 127, 128, 129, 700]),
    (4, 4, 4, 128, [2047, 0, 1500, 64])])
@pytest.mark.parametrize("chunk", [128, 64, 256, 384])
def test_attention_rope_matches_composition(dtype, B, hq, hkv, D, positions, chunk):
    bs = 16
    max_blocks = 2048 // bs
    case = attn_case(dtype, B, hq, hkv, D, bs, nb=max_blocks * B + 3, max_blocks=max_blocks, positions=positions)
    out, k, v, ctr = run_attn_fused(case, hq, chunk=chunk)
    ro, rk, rv, rq = run_attn_composed(case, hq)
    assert k.tobytes() == rk.tobytes(), "k cache differs from rope_append's"
    assert v.tobytes() == rv.tobytes(), "v cache differs from rope_append's"
    assert not ctr.any(), "counters not reset"
    check_attention(out, ro, rq, k, v, case[3], case[4], dtype)
    out2, _, _, _ = run_attn_fused(case, hq, chunk=chunk)
    assert out.tobytes() == out2.tobytes(), "not the same bits twice"


@cuda_only
@pytest.mark.parametrize("rd,il", [(None, True), (32, False), (64, True)])
def test_attention_rope_rotary_variants_and_bad_page(rd, il):
    B, hq, hkv, D, bs = 3, 8, 2, 128, 16
    case = attn_case("bfloat16", B, hq, hkv, D, bs, nb=40, max_blocks=12, positions=[33, 150, 7], bad=1)
    out, k, v, _ = run_attn_fused(case, hq, rd=rd, il=il)
    ro, rk, rv, rq = run_attn_composed(case, hq, rd=rd, il=il)
    assert k.tobytes() == rk.tobytes() and v.tobytes() == rv.tobytes()
    check_attention(out, ro, rq, k, v, case[3], case[4], "bfloat16")


@cuda_only
@pytest.mark.parametrize("chunk", [128, 64, 384])
def test_attention_rope_trigger_same_bits(chunk):
    # The PDL trigger's place (0 before the wait .. 3 at exit) changes no bits.
    B, hq, hkv, D, bs = 2, 32, 8, 128, 16
    case = attn_case("bfloat16", B, hq, hkv, D, bs, nb=60, max_blocks=24, positions=[383, 130])
    ref = None
    for trig in range(4):
        qkv, kc, vc, pos, bt = case
        k, v = arr(kc.copy(), "cuda"), arr(vc.copy(), "cuda")
        out, ctr = _C.llm.fused_attention_rope(arr(qkv, "cuda"), hq, k, v, arr(pos, "cuda"), arr(bt, "cuda"),
                                               theta=10000.0, chunk=chunk, trigger=trig)
        got = (np_of(out).tobytes(), np_of(k).tobytes(), np_of(v).tobytes())
        assert not np_of(ctr).any(), f"trigger {trig}: counters not reset"
        if ref is None:
            ref = got
            ro, _, _, rq = run_attn_composed(case, hq)
            check_attention(np_of(out), ro, rq, np_of(k), np_of(v), pos, bt, "bfloat16")
        assert got == ref, f"trigger {trig}: not the bits of trigger 0"
    if chunk <= 128:  # the cluster merge (3 or 6 chunks; 1 for the short sequence): the same bits
        for trig in (0, 3):
            k, v = arr(kc.copy(), "cuda"), arr(vc.copy(), "cuda")
            out, _ = _C.llm.fused_attention_rope(arr(qkv, "cuda"), hq, k, v, arr(pos, "cuda"), arr(bt, "cuda"),
                                                 theta=10000.0, chunk=chunk, trigger=trig, cluster=True)
            got = (np_of(out).tobytes(), np_of(k).tobytes(), np_of(v).tobytes())
            assert got == ref, f"cluster merge, trigger {trig}: not the bits of the workspace merge"


@cuda_only
def test_attention_rope_row_independent_of_batch():
    # A sequence's output bits do not depend on the other sequences of the batch.
    B, hq, hkv, D, bs = 4, 8, 2, 64, 16
    case = attn_case("bfloat16", B, hq, hkv, D, bs, nb=200, max_blocks=40, positions=[300, 20, 600, 129])
    out, _, _, _ = run_attn_fused(case, hq)
    qkv, kc, vc, pos, bt = case
    solo = (qkv[2:3], kc, vc, pos[2:3], bt[2:3])
    o1, _, _, _ = run_attn_fused(solo, hq)
    assert out[2:3].tobytes() == o1.tobytes()


def test_attention_rope_bad_input():
    qkv = arr(np.zeros((1, (4 + 4) * 16), np.float32))
    kc = arr(np.zeros((4, 16, 2, 16), np.float32))
    pos = arr(np.zeros(1, np.int32))
    bt = arr(np.zeros((1, 2), np.int32))
    with pytest.raises(ValueError, match="qkv"):
        _C.llm.fused_attention_rope(qkv, 3, kc, kc, pos, bt)
    with pytest.raises(ValueError, match="positions"):
        _C.llm.fused_attention_rope(qkv, 4, kc, kc, arr(np.zeros(2, np.int32)), bt)
    with pytest.raises(ValueError, match="block_table"):
        _C.llm.fused_attention_rope(qkv, 4, kc, kc, pos, arr(np.zeros((2, 2), np.int32)))
    with pytest.raises(ValueError, match="rotary_dim"):
        _C.llm.fused_attention_rope(qkv, 4, kc, kc, pos, bt, rotary_dim=3)
    with pytest.raises(ValueError, match="trigger"):
        _C.llm.fused_attention_rope(qkv, 4, kc, kc, pos, bt, trigger=4)
    with pytest.raises(ValueError, match="chunk"):
        _C.llm.fused_attention_rope(qkv, 4, kc, kc, pos, bt, chunk=192)


@cuda_only
@pytest.mark.parametrize("quantize", [None, "int4"])
def test_fused_attention_engine(quantize):
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=7, quantize=quantize)
    assert not m._m.fused_attention
    m._m.fused_attention_auto = False  # base: the two-launch path (auto takes head_dim 64 since session 7)
    n_base = m._m.fused_attention_layers
    base = run(m, True, new=24)
    assert m._m.fused_attention_layers == n_base, "auto off: the fused attention was taken"
    m._m.fused_attention = True
    n0 = m._m.fused_attention_layers
    alt = run(m, True, new=24)
    assert m._m.fused_attention_layers > n0, "the fused attention was not taken"
    same(alt, run(m, False, new=24), "fused attention: graph vs eager")
    for trig in (1, 2, 3):  # where the CTAs let the o GEMV launch: the same bits
        m._m.fused_attention_trigger = trig
        same(alt, run(m, True, new=24), f"fused attention, trigger {trig}, graph")
    m._m.fused_attention_trigger = 0
    for t, (x, y) in enumerate(zip(base[1], alt[1])):
        if base[0][:t] != alt[0][:t]:
            break
        rel = float(np.max(np.abs(x - y)) / np.max(np.abs(x)))
        assert rel < 3e-2, f"step {t} max rel diff {rel:.3g}"
    for ch in (64, 256, 0):  # 0: one CTA per kv head (the whole table in one chunk here)
        m._m.fused_attention_chunk = ch
        alt_c = run(m, True, new=24)
        same(alt_c, run(m, False, new=24), f"fused attention, {ch}-key chunks: graph vs eager")
        for t, (x, y) in enumerate(zip(alt[1], alt_c[1])):
            if alt[0][:t] != alt_c[0][:t]:
                break
            rel = float(np.max(np.abs(x - y)) / np.max(np.abs(x)))
            assert rel < 3e-2, f"chunk {ch}: step {t} max rel diff {rel:.3g}"
    # the cluster merge (64-key chunks, 70 keys: 2 chunks) against the workspace merge: the same bits
    m._m.fused_attention_chunk = 64
    m._m.fused_attention_cluster = False
    ws = run(m, True, new=40)
    m._m.fused_attention_cluster = True
    same(ws, run(m, True, new=40), "fused attention, cluster merge vs workspace merge, graph")
    same(ws, run(m, False, new=40), "fused attention, cluster merge vs workspace merge, eager")
    m._m.fused_attention_max_keys = 16  # shorter than the block table: the two-launch path
    same(base, run(m, True, new=24), "fused attention off by max_keys")


@cuda_only
def test_attention_rope_position_past_the_table():
    # The new token's page is past the block table: not stored; keys up to the table's end.
    B, hq, hkv, D, bs = 2, 8, 2, 64, 16
    case = attn_case("bfloat16", B, hq, hkv, D, bs, nb=20, max_blocks=3, positions=[60, 47])
    out, k, v, ctr = run_attn_fused(case, hq)
    ro, rk, rv, rq = run_attn_composed(case, hq)
    assert k.tobytes() == rk.tobytes() and v.tobytes() == rv.tobytes() and not ctr.any()
    check_attention(out, ro, rq, k, v, case[3], case[4], "bfloat16")


def test_fused_attention_options():
    m = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)
    assert m._m.fused_attention_trigger == 0 and m._m.fused_attention_chunk == -1  # 64 with fp8 / int8 weights, else 128
    assert not m._m.fused_attention and m._m.fused_attention_auto and m._m.fused_attention_cluster
    assert not m._m.quantized_pdl
    for v in (0, 1, 2, 3):
        m._m.fused_attention_trigger = v
        assert m._m.fused_attention_trigger == v
    for v in (0, 64, 128, 256, 384, -1):
        m._m.fused_attention_chunk = v
        assert m._m.fused_attention_chunk == v
    with pytest.raises(ValueError, match="fused_attention_trigger"):
        m._m.fused_attention_trigger = 4
    with pytest.raises(ValueError, match="fused_attention_chunk"):
        m._m.fused_attention_chunk = 192
    assert m._m.attn_l2 == 0
    for v in (2, 3, 4):
        m._m.attn_l2 = v
        assert m._m.attn_l2 == v
    for v in (-1, 5):
        with pytest.raises(ValueError, match="attn_l2"):
            m._m.attn_l2 = v
    assert not m._m.kv_l2
    m._m.kv_l2 = True
    assert not m._m.quantized_pdl_compact
    m._m.quantized_pdl_compact = True
    assert m._m.quantized_pdl_compact
    assert m._m.fused_attention_layers == 0  # CPU: never the fused kernel
    assert m._m.carveout == -1
    for v in (-1, 0, 50, 100):
        m._m.carveout = v
        assert m._m.carveout == v
    for v in (-2, 101):
        with pytest.raises(ValueError, match="carveout"):
            m._m.carveout = v
    m._m.carveout = 100
    same(run(m, False, new=3), run(gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1), False, new=3),
         "CPU: carveout has no effect")


@cuda_only
def test_fused_attention_auto():
    # head_dim 128, plain weights, a short block table: the fused attention by default, the
    # bits of fused_attention=True; auto off: the two-launch path; quantized: not taken.
    m = gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=11)
    assert m._m.fused_attention_auto and not m._m.fused_attention
    n0 = m._m.fused_attention_layers
    auto = run(m, True, new=20)
    assert m._m.fused_attention_layers > n0, "auto: the fused attention was not taken"
    same(auto, run(m, False, new=20), "auto: graph vs eager")
    m._m.fused_attention = True
    same(auto, run(m, True, new=20), "auto vs fused_attention=True")
    m._m.fused_attention = False
    m._m.fused_attention_auto = False
    n1 = m._m.fused_attention_layers
    two = run(m, True, new=20)
    assert m._m.fused_attention_layers == n1, "auto off: the fused attention was taken"
    for t, (x, y) in enumerate(zip(auto[1], two[1])):
        if auto[0][:t] != two[0][:t]:
            break
        rel = float(np.max(np.abs(x - y)) / np.max(np.abs(x)))
        assert rel < 3e-2, f"step {t} max rel diff {rel:.3g}"
    q = gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=11, quantize="int8")
    q._m.fused_attention_auto_quant = False  # (on by default: it takes fp8, int8 and int4 weights)
    run(q, True, new=4)
    assert q._m.fused_attention_layers == 0, "auto took the fused attention with quantized weights"


@cuda_only
@pytest.mark.parametrize("cfg", ["64", "128"])
def test_carveout_same_bits(cfg):
    # EngineOptions::carveout only sets the kernels' preferred shared memory split: the
    # same tokens and logits, graph and eager, with the fused attention (taken by auto at
    # head_dim 128, and at head_dim 64 since session 7); back to the default after it.
    m = gk.llm.random_model(CFG if cfg == "64" else CFG128, device="cuda", dtype="bfloat16", seed=17)
    base = run(m, True, new=20)
    n0 = m._m.fused_attention_layers
    for v in (100, 0, -1):
        m._m.carveout = v
        same(base, run(m, True, new=20), f"carveout {v}, graph")
        same(base, run(m, False, new=20), f"carveout {v}, eager")
    if cfg == "128":
        assert m._m.fused_attention_layers > n0, "the fused attention was not taken"


@cuda_only
@pytest.mark.parametrize("chunk", [128, 0])
def test_attention_stamps(chunk):
    # Debug stamps of one layer's fused attention: the same bits; every CTA that wrote its
    # output stamped all 8 phases in order (%globaltimer does not go back).
    m = gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=19)
    m._m.fused_attention_chunk = chunk
    base = run(m, True, new=20)
    m._m.set_attention_stamps(1)
    n0 = m._m.fused_attention_layers
    same(base, run(m, True, new=20), "attention stamps on, graph")
    assert m._m.fused_attention_layers > n0, "the fused attention was not taken"
    st = np_of(m._m.attention_stamps()).astype(np.int64)
    assert st.shape == (512, 8)
    done = st[st[:, 7] > 0]
    assert len(done) >= 2, f"no complete stamp rows: {st[st[:, 0] > 0][:4]}"
    assert (done > 0).all(), f"a phase without a stamp: {done[(done == 0).any(axis=1)][:4]}"
    d = np.diff(done, axis=1)
    assert (d >= 0).all(), f"stamps out of order: {done[(d < 0).any(axis=1)][:4]}"
    m._m.set_attention_stamps(-1)
    same(base, run(m, False, new=20), "attention stamps off again, eager")


def test_attention_stamps_cpu():
    m = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)
    m._m.set_attention_stamps(0)
    run(m, False, new=2)
    assert np_of(m._m.attention_stamps()).shape == (0, 8)
    m._m.set_attention_stamps(-1)
