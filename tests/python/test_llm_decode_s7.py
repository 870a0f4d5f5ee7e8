"""Engine decode options of session 7 prep (src/llm, src/cuda/llm_attention*.cu): the fused
attention's push merge (fused_attention_push; src/cuda/llm_attention_push.cuh): chunks 1..S-1
of a (sequence, kv head) store their partials into chunk 0's shared memory with st.async,
counted on an mbarrier there, and chunk 0 merges with the pull merge's arithmetic in the
same chunk order. So: the same bits as the pull (cluster) merge and the workspace merge,
every run, graph and eager, independent of the batch; within rounding of float64
attention. Also quantized_attention_pdl (the fused attention alone with PDL on quantized
weights) and fused_attention_auto_hd64 / _quant (where auto takes the fused attention): the
same bits as the explicit settings. Only the auto tests' "not taken" runs go through
attention_decode (another area's kernel). CUDA parts skip without a GPU."""
import numpy as np
import pytest

import gpukit as gk
from gpukit import _C

from test_llm_attention_fused import attn_case
from test_llm_decode_s6 import check_f64, fa_on, rope_ref
from test_llm_step import CFG, CFG128, cuda_only, np_of, run, same
from test_llm_step import arr


def run_attn(case, hq, chunk=128, trigger=0, cluster=True, mma=True, push=True):
    qkv, kc, vc, pos, bt = case
    k, v = arr(kc.copy(), "cuda"), arr(vc.copy(), "cuda")
    out, ctr = _C.llm.fused_attention_rope(arr(qkv, "cuda"), hq, k, v, arr(pos, "cuda"), arr(bt, "cuda"),
                                           theta=10000.0, chunk=chunk, trigger=trigger, cluster=cluster, mma=mma,
                                           push=push)
    return np_of(out), np_of(k), np_of(v), np_of(ctr)


def first_diff(a, b):
    x, y = np.frombuffer(a.tobytes(), np.uint16), np.frombuffer(b.tobytes(), np.uint16)
    i = np.flatnonzero(x != y)
    return "identical" if i.size == 0 else f"{i.size} of {x.size} differ, first at {int(i[0])}"


def test_fused_attention_push_option():
    m = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)
    assert not m._m.fused_attention_push  # off by default (8B bf16: not faster at checkpoint A of session 7)
    assert m._m.fused_attention_push_auto  # on: head_dim 64 and quantized weights (session 7)
    m._m.fused_attention_push = True
    m._m.fused_attention_push_auto = False
    assert m._m.fused_attention_push and not m._m.fused_attention_push_auto
    ref = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)
    same(run(m, False, new=3), run(ref, False, new=3), "CPU: fused_attention_push has no effect")


# (B, hq, hkv, D, positions, bs, max_blocks): the grid's S chunks = max_blocks * bs / chunk;
# positions give 1..S chunks with keys (keyless chunks, a sequence of one chunk: no merge).
CASES = [
    (1, 32, 8, 128, [383], 16, 24),          # 8B shape: 3 chunks of 128 (6 of 64)
    (1, 32, 8, 128, [200], 16, 24),          # 2 of 3 (4 of 6) chunks with keys
    (2, 32, 8, 128, [383, 130], 16, 24),     # sequences of different lengths
    (3, 8, 8, 64, [5, 500, 1023], 16, 64),   # S = 8 (128) / 16 (64: no cluster): 1..8 chunks
    (2, 6, 1, 64, [77, 250], 16, 16),        # group of 6: the P V pass's second head block
    (4, 16, 2, 128, [1000, 0, 511, 129], 32, 32),  # group of 8, S = 8 at 128 keys
    (1, 5, 1, 128, [300], 16, 24),           # odd group
]


@cuda_only
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("B,hq,hkv,D,positions,bs,mb", CASES)
@pytest.mark.parametrize("chunk", [128, 64])
def test_push_merge_same_bits_as_pull_and_f64(dtype, B, hq, hkv, D, positions, bs, mb, chunk):
    case = attn_case(dtype, B, hq, hkv, D, bs, nb=mb * B + 3, max_blocks=mb, positions=positions, seed=B + hq)
    pull, pk, pv, _ = run_attn(case, hq, chunk=chunk, push=False)
    ws, _, _, _ = run_attn(case, hq, chunk=chunk, cluster=False, push=False)
    assert pull.tobytes() == ws.tobytes(), f"pull vs workspace merge: {first_diff(pull, ws)}"
    out, k, v, ctr = run_attn(case, hq, chunk=chunk)
    assert not ctr.any(), "counters not zero"
    assert k.tobytes() == pk.tobytes() and v.tobytes() == pv.tobytes(), "push: caches differ from the pull run's"
    assert out.tobytes() == pull.tobytes(), f"push vs pull merge: {first_diff(out, pull)}"
    for _ in range(3):
        again, _, _, _ = run_attn(case, hq, chunk=chunk)
        assert again.tobytes() == out.tobytes(), f"push: not the same bits run to run: {first_diff(again, out)}"
    rq, rk, rv = rope_ref(case, hq)
    assert k.tobytes() == rk.tobytes() and v.tobytes() == rv.tobytes(), "caches differ from rope_append's"
    err = check_f64(out, rq, k, v, case[3], case[4], dtype)
    print(f"push: max |out - f64| {err:.3g}")


@cuda_only
@pytest.mark.parametrize("chunk", [128, 64])
def test_push_merge_triggers_same_bits(chunk):
    B, hq, hkv, D, bs = 2, 32, 8, 128, 16
    case = attn_case("bfloat16", B, hq, hkv, D, bs, nb=60, max_blocks=24, positions=[383, 130])
    ref, _, _, _ = run_attn(case, hq, chunk=chunk, push=False)
    for trig in range(4):
        out, _, _, ctr = run_attn(case, hq, chunk=chunk, trigger=trig)
        assert out.tobytes() == ref.tobytes(), f"push, trigger {trig}: {first_diff(out, ref)}"


@cuda_only
def test_push_merge_row_independent_of_batch():
    B, hq, hkv, D, bs = 4, 32, 8, 128, 16
    case = attn_case("bfloat16", B, hq, hkv, D, bs, nb=200, max_blocks=40, positions=[300, 20, 600, 129])
    out, _, _, _ = run_attn(case, hq)
    qkv, kc, vc, pos, bt = case
    for b in range(B):
        o1, _, _, _ = run_attn((qkv[b:b + 1], kc, vc, pos[b:b + 1], bt[b:b + 1]), hq)
        assert out[b:b + 1].tobytes() == o1.tobytes(), f"row {b}: {first_diff(out[b:b + 1], o1)}"


@cuda_only
def test_push_needs_cluster_and_mma():
    # push without the cluster merge or without the mma passes: those paths, unchanged bits
    case = attn_case("bfloat16", 1, 32, 8, 128, 16, nb=30, max_blocks=24, positions=[300])
    for cl, mma in ((False, True), (True, False), (False, False)):
        ref, _, _, _ = run_attn(case, 32, cluster=cl, mma=mma, push=False)
        out, _, _, _ = run_attn(case, 32, cluster=cl, mma=mma, push=True)
        assert out.tobytes() == ref.tobytes(), f"cluster {cl}, mma {mma}: {first_diff(out, ref)}"


@cuda_only
@pytest.mark.parametrize("quantize", [None, "int4"])
def test_fused_attention_push_engine(quantize):
    # The engine with the push merge: 64-key chunks, prompts of up to 30 + 40 tokens (2
    # chunks): the same tokens and logits as the pull merge, graph and eager; stamps ordered
    # (int4: the quantized path's fused attention writes them too since session 7; checkpoint
    # A found none there). push_auto off: the base run takes the pull merge.
    m = fa_on(gk.llm.random_model(CFG128 if quantize is None else CFG, device="cuda", dtype="bfloat16", seed=43,
                                  quantize=quantize))
    m._m.fused_attention_push_auto = False
    m._m.fused_attention_chunk = 64
    assert m._m.fused_attention_cluster and m._m.fused_attention_mma
    base = run(m, True, new=40)
    m._m.fused_attention_push = True
    n0 = m._m.fused_attention_layers
    same(base, run(m, True, new=40), "push vs pull merge, graph")
    assert m._m.fused_attention_layers > n0, "the fused attention was not taken"
    same(base, run(m, False, new=40), "push vs pull merge, eager")
    for trig in (1, 2, 3):
        m._m.fused_attention_trigger = trig
        same(base, run(m, True, new=40), f"push, trigger {trig}")
    m._m.fused_attention_trigger = 0
    m._m.set_attention_stamps(1)
    same(base, run(m, True, new=40), "push, stamps on")
    st = np_of(m._m.attention_stamps()).astype(np.int64)
    done = st[st[:, 7] > 0]
    assert len(done) >= 1 and (np.diff(done, axis=1) >= 0).all(), f"stamps: {done[:4]}"
    m._m.set_attention_stamps(-1)
    m._m.fused_attention_push = False
    same(base, run(m, True, new=40), "push off again")


# ---- quantized_attention_pdl: the fused attention alone launched with PDL (quantized weights) ----

def test_quantized_attention_pdl_option():
    m = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1, quantize="int8")
    assert m._m.quantized_attention_pdl  # on by default (session 7, checkpoint A)
    m._m.quantized_attention_pdl = False
    assert not m._m.quantized_attention_pdl
    ref = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1, quantize="int8")
    same(run(m, False, new=3), run(ref, False, new=3), "CPU: quantized_attention_pdl has no effect")


@cuda_only
@pytest.mark.parametrize("quantize", ["int4", "fp8"])
def test_quantized_attention_pdl_same_bits(quantize):
    # Only the launch changes (PDL): the same tokens and logits, graph and eager, with both
    # merges and every trigger; quantized_pdl stays off (the default).
    m = fa_on(gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=47, quantize=quantize))
    assert not m._m.quantized_pdl
    m._m.quantized_attention_pdl = False  # (on by default since session 7)
    m._m.fused_attention_push_auto = False
    base = run(m, True, new=24)
    m._m.quantized_attention_pdl = True
    n0 = m._m.fused_attention_layers
    same(base, run(m, True, new=24), f"{quantize}: quantized_attention_pdl, graph")
    assert m._m.fused_attention_layers > n0, "the fused attention was not taken"
    same(base, run(m, False, new=24), f"{quantize}: quantized_attention_pdl, eager")
    for trig in (1, 3):
        m._m.fused_attention_trigger = trig
        same(base, run(m, True, new=24), f"{quantize}: quantized_attention_pdl, trigger {trig}")
    m._m.fused_attention_trigger = 0
    m._m.fused_attention_push = True
    same(base, run(m, True, new=24), f"{quantize}: quantized_attention_pdl + push merge")
    m._m.fused_attention_push = False
    m._m.quantized_attention_pdl = False
    same(base, run(m, True, new=24), f"{quantize}: quantized_attention_pdl off again")


# ---- fused_attention_auto_hd64 / _quant: where auto takes the fused attention ----

def test_fused_attention_auto_more_options():
    m = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)
    assert m._m.fused_attention_auto_hd64 and m._m.fused_attention_auto_quant  # on by default (session 7)
    m._m.fused_attention_auto_hd64 = False
    m._m.fused_attention_auto_quant = False
    assert not m._m.fused_attention_auto_hd64 and not m._m.fused_attention_auto_quant
    ref = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)
    same(run(m, False, new=3), run(ref, False, new=3), "CPU: the auto options have no effect")


@cuda_only
def test_fused_attention_auto_hd64():
    # head_dim 64 (CFG): without auto_hd64 on rope_append + attention_decode; with it (the
    # default) the fused attention with the push merge in 128-key chunks (push_auto): the bits
    # of fused_attention + fused_attention_push; push_auto off: one CTA per kv head, the bits
    # of fused_attention + chunk 0.
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=53)
    assert m._m.fused_attention_auto and not m._m.fused_attention and m._m.fused_attention_auto_hd64
    m._m.fused_attention_auto_hd64 = False
    n0 = m._m.fused_attention_layers
    run(m, True, new=4)
    assert m._m.fused_attention_layers == n0, "auto took head_dim 64 without the option"
    m._m.fused_attention_auto_hd64 = True
    got = run(m, True, new=24)
    assert m._m.fused_attention_layers > n0, "auto_hd64: the fused attention was not taken"
    same(got, run(m, False, new=24), "auto_hd64: graph vs eager")
    m._m.fused_attention_push_auto = False
    got0 = run(m, True, new=24)
    m._m.fused_attention_auto_hd64 = False
    m._m.fused_attention = True
    m._m.fused_attention_push = True
    same(got, run(m, True, new=24), "auto_hd64 vs fused_attention with the push merge")
    m._m.fused_attention_push = False
    m._m.fused_attention_chunk = 0
    same(got0, run(m, True, new=24), "auto_hd64 without push_auto vs fused_attention with chunk 0")


@cuda_only
@pytest.mark.parametrize("quantize", ["int8", "int4", "fp8"])
def test_fused_attention_auto_quant(quantize):
    # auto_quant (default on since session 7) takes fp8 weights, int4 since session 8 (with
    # fused_attention_wide) and int8 since session 16.
    m = gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=59, quantize=quantize)
    assert m._m.fused_attention_auto_quant and m._m.quantized_attention_pdl
    m._m.fused_attention_auto_quant = False
    n0 = m._m.fused_attention_layers
    run(m, True, new=4)
    assert m._m.fused_attention_layers == n0, "auto took quantized weights without the option"
    m._m.fused_attention_auto_quant = True
    got = run(m, True, new=24)
    assert m._m.fused_attention_layers > n0, "auto_quant: the fused attention was not taken"
    same(got, run(m, False, new=24), f"{quantize}: auto_quant, graph vs eager")
    m._m.fused_attention_auto_quant = False
    m._m.fused_attention = True
    same(got, run(m, True, new=24), f"{quantize}: auto_quant vs fused_attention")
