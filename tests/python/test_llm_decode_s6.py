"""Engine decode options of session 6 (src/llm, src/cuda/llm_*.cu): each only moves work or
sets a cache hint, so the tokens and logits keep their bits (graph and eager, one sequence,
where the batch-1 kernels run, and three); the fused attention's tensor-core passes against
float64 attention. No test here calls attention_decode (another area's kernel): the engine
runs take the fused attention, the references are rope_append and NumPy. CUDA parts skip
without a GPU."""
import numpy as np
import pytest

import gpukit as gk
from gpukit import _C

from test_llm_step import CFG, CFG128, PROMPTS, cuda_only, np_of, same

ONE = [[(i * 53 + 7) % 512 for i in range(37)]]


def run_p(m, graph, prompts, new=16):
    g = _C.llm.Generation(m._m, prompts, max_new_tokens=new, ignore_eos=True, cuda_graph=graph, lookahead=False)
    steps, logits = [], []
    while not g.done:
        steps.append(list(g.step()))
        logits.append(np_of(g.last_logits()).astype(np.float32))
    return steps, logits


def fa_on(m):
    m._m.fused_attention = True  # the engine's own attention kernel (no attention_decode)
    return m


def test_weights_evict_first_option():
    m = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)
    assert not m._m.weights_evict_first
    m._m.weights_evict_first = True
    assert m._m.weights_evict_first
    ref = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)
    same(run_p(m, False, ONE, new=3), run_p(ref, False, ONE, new=3), "CPU: weights_evict_first has no effect")


@cuda_only
@pytest.mark.parametrize("cfg", ["64", "128"])
@pytest.mark.parametrize("batch", [1, 3])
def test_weights_evict_first_same_bits(cfg, batch):
    # The engine GEMV's weight loads with an L2 evict-first policy (one sequence: its own
    # kernel instantiation; three: not taken): the same tokens and logits, graph and eager.
    m = fa_on(gk.llm.random_model(CFG if cfg == "64" else CFG128, device="cuda", dtype="bfloat16", seed=23))
    prompts = ONE if batch == 1 else PROMPTS
    base = run_p(m, True, prompts)
    m._m.weights_evict_first = True
    same(base, run_p(m, True, prompts), "weights_evict_first, graph")
    same(base, run_p(m, False, prompts), "weights_evict_first, eager")
    m._m.weights_evict_first = False
    same(base, run_p(m, True, prompts), "weights_evict_first off again, graph")


@cuda_only
def test_weights_evict_first_quantized_untouched():
    # Quantized weights: the option does not apply (the quantized GEMVs are not the engine's).
    m = fa_on(gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=29, quantize="int4"))
    base = run_p(m, True, ONE)
    m._m.weights_evict_first = True
    same(base, run_p(m, True, ONE), "int4, weights_evict_first, graph")


# ---- the fused attention's tensor-core score pass and 16-byte P V pass (mma=True) ----

from test_llm_attention_fused import attn_case, ref_attention  # noqa: E402
from test_llm_step import arr, first_bad, run  # noqa: E402
from test_gemv import f64  # noqa: E402


def rope_ref(case, hq, rd=None, il=False):
    """rope_append (the engine's kernel) on copies: the rotated q [B, hq, D] and the caches
    with the new tokens, the reference the fused attention must match (caches bit for bit)."""
    qkv, kc, vc, pos, bt = case
    B = qkv.shape[0]
    hkv, D = kc.shape[2], kc.shape[3]
    Q, KV = hq * D, hkv * D
    k, v = arr(kc.copy(), "cuda"), arr(vc.copy(), "cuda")
    q2 = arr(np.ascontiguousarray(qkv[:, :Q]).reshape(B, hq, D), "cuda")
    k2 = arr(np.ascontiguousarray(qkv[:, Q:Q + KV]).reshape(B, hkv, D), "cuda")
    v2 = arr(np.ascontiguousarray(qkv[:, Q + KV:]).reshape(B, hkv, D), "cuda")
    _C.llm.fused_rope_append(q2, k2, v2, k, v, arr(pos, "cuda"), arr(bt, "cuda"), rotary_dim=rd, interleaved=il)
    return np_of(q2), np_of(k), np_of(v)


def check_f64(out, q, kc, vc, pos, bt, dtype):
    """Within output rounding of float64 attention of the rotated q over the caches."""
    ref = ref_attention(q, kc, vc, pos, bt)
    eps = 2.0**-8 if dtype == "bfloat16" else 2.0**-11
    vmax = float(np.max(np.abs(f64(vc))))
    err = float(np.max(np.abs(f64(out) - ref)))
    msg = first_bad(f64(out), ref, eps * np.abs(ref) + 2e-5 * vmax)
    assert msg is None, f"{msg} (max |out - f64| {err:.3g})"
    return err


def run_attn_mma(case, hq, chunk=128, trigger=0, cluster=False, mma=True, rd=None, il=False):
    qkv, kc, vc, pos, bt = case
    k, v = arr(kc.copy(), "cuda"), arr(vc.copy(), "cuda")
    out, ctr = _C.llm.fused_attention_rope(arr(qkv, "cuda"), hq, k, v, arr(pos, "cuda"), arr(bt, "cuda"),
                                           theta=10000.0, rotary_dim=rd, interleaved=il, chunk=chunk,
                                           trigger=trigger, cluster=cluster, mma=mma)
    return np_of(out), np_of(k), np_of(v), np_of(ctr)


@cuda_only
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("B,hq,hkv,D,positions", [
    (1, 32, 8, 128, [0]), (1, 32, 8, 128, [127]), (1, 32, 8, 128, [128]), (1, 32, 8, 128, [383]),
    (3, 8, 8, 64, [5, 200, 1000]), (2, 16, 2, 64, [130, 17]), (8, 8, 1, 128, [1, 2, 3, 300, 127, 128, 129, 700]),
    (4, 4, 4, 128, [2047, 0, 1500, 64]), (2, 6, 1, 64, [77, 250]), (1, 5, 1, 128, [300])])
@pytest.mark.parametrize("chunk", [128, 64, 256, 384])
def test_attention_rope_mma_matches_f64(dtype, B, hq, hkv, D, positions, chunk):
    # Against float64 attention of rope_append's rotated q over its caches (group sizes 1 to
    # 8: 8 and 6 take the P V pass's second head block); the caches are rope_append's bits.
    bs = 16
    max_blocks = 2048 // bs
    case = attn_case(dtype, B, hq, hkv, D, bs, nb=max_blocks * B + 3, max_blocks=max_blocks, positions=positions)
    out, k, v, ctr = run_attn_mma(case, hq, chunk=chunk)
    rq, rk, rv = rope_ref(case, hq)
    assert k.tobytes() == rk.tobytes(), "k cache differs from rope_append's"
    assert v.tobytes() == rv.tobytes(), "v cache differs from rope_append's"
    assert not ctr.any(), "counters not reset"
    err = check_f64(out, rq, k, v, case[3], case[4], dtype)
    out2, _, _, _ = run_attn_mma(case, hq, chunk=chunk)
    assert out.tobytes() == out2.tobytes(), "not the same bits twice"
    old, _, _, _ = run_attn_mma(case, hq, chunk=chunk, mma=False)
    err_old = check_f64(old, rq, k, v, case[3], case[4], dtype)
    print(f"max |mma - f64| {err:.3g}, |scalar - f64| {err_old:.3g}")


@cuda_only
@pytest.mark.parametrize("chunk", [128, 64])
def test_attention_rope_mma_triggers_and_merges_same_bits(chunk):
    # mma: the trigger's place and the cluster merge (against the workspace merge) change no bits.
    B, hq, hkv, D, bs = 2, 32, 8, 128, 16
    case = attn_case("bfloat16", B, hq, hkv, D, bs, nb=60, max_blocks=24, positions=[383, 130])
    ref = None
    for trig in range(4):
        for cl in (False, True):
            out, k, v, ctr = run_attn_mma(case, hq, chunk=chunk, trigger=trig, cluster=cl)
            assert not ctr.any(), f"trigger {trig}, cluster {cl}: counters not reset"
            got = (out.tobytes(), k.tobytes(), v.tobytes())
            if ref is None:
                ref = got
                rq, _, _ = rope_ref(case, hq)
                check_f64(out, rq, k, v, case[3], case[4], "bfloat16")
            assert got == ref, f"trigger {trig}, cluster {cl}: not the bits of trigger 0, workspace merge"


@cuda_only
@pytest.mark.parametrize("rd,il", [(None, True), (32, False)])
def test_attention_rope_mma_rotary_variants(rd, il):
    B, hq, hkv, D, bs = 3, 8, 2, 128, 16
    case = attn_case("bfloat16", B, hq, hkv, D, bs, nb=40, max_blocks=12, positions=[33, 150, 7], bad=1)
    out, k, v, _ = run_attn_mma(case, hq, rd=rd, il=il)
    rq, rk, rv = rope_ref(case, hq, rd=rd, il=il)
    assert k.tobytes() == rk.tobytes() and v.tobytes() == rv.tobytes()
    check_f64(out, rq, k, v, case[3], case[4], "bfloat16")


@cuda_only
def test_attention_rope_mma_row_independent_of_batch():
    B, hq, hkv, D, bs = 4, 8, 2, 64, 16
    case = attn_case("bfloat16", B, hq, hkv, D, bs, nb=200, max_blocks=40, positions=[300, 20, 600, 129])
    out, _, _, _ = run_attn_mma(case, hq)
    qkv, kc, vc, pos, bt = case
    o1, _, _, _ = run_attn_mma((qkv[2:3], kc, vc, pos[2:3], bt[2:3]), hq)
    assert out[2:3].tobytes() == o1.tobytes()


def test_fused_attention_mma_option():
    m = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)
    assert m._m.fused_attention_mma  # on by default (session 6, checkpoint A: 8B 237.9 tok/s against 230.8)
    m._m.fused_attention_mma = False
    assert not m._m.fused_attention_mma


@cuda_only
@pytest.mark.parametrize("chunk", [128, 0, 64])
def test_fused_attention_mma_engine(chunk):
    # The engine with fused_attention_mma: graph == eager, cluster == workspace merge, the
    # stamps change nothing, and close to the scalar passes' logits.
    m = gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=31)
    m._m.fused_attention_chunk = chunk
    m._m.fused_attention_mma = False
    base = run(m, True, new=24)
    m._m.fused_attention_mma = True
    n0 = m._m.fused_attention_layers
    alt = run(m, True, new=24)
    assert m._m.fused_attention_layers > n0, "the fused attention was not taken"
    same(alt, run(m, False, new=24), "mma: graph vs eager")
    m._m.fused_attention_cluster = not m._m.fused_attention_cluster
    same(alt, run(m, True, new=24), "mma: the other merge")
    m._m.fused_attention_cluster = not m._m.fused_attention_cluster
    m._m.set_attention_stamps(1)
    same(alt, run(m, True, new=24), "mma: stamps on")
    st = np_of(m._m.attention_stamps()).astype(np.int64)
    done = st[st[:, 7] > 0]
    assert len(done) >= 1 and (np.diff(done, axis=1) >= 0).all(), f"stamps: {done[:4]}"
    m._m.set_attention_stamps(-1)
    for t, (x, y) in enumerate(zip(base[1], alt[1])):
        if base[0][:t] != alt[0][:t]:
            break
        rel = float(np.max(np.abs(x - y)) / np.max(np.abs(x)))
        assert rel < 3e-2, f"step {t} max rel diff {rel:.3g}"
    m._m.fused_attention_mma = False
    same(base, run(m, True, new=24), "mma off again")


# ---- quant_streaming: the quantized GEMVs' codes in a streaming L2 access policy window ----

def test_quant_streaming_option():
    m = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1, quantize="int8")
    assert m._m.quant_streaming  # on by default (session 6, checkpoint A: int4 395.5 tok/s against 377.0)
    m._m.quant_streaming = False
    ref = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1, quantize="int8")
    same(run_p(m, False, ONE, new=3), run_p(ref, False, ONE, new=3), "CPU: quant_streaming has no effect")


@cuda_only
@pytest.mark.parametrize("quantize", ["int4", "fp8"])
@pytest.mark.parametrize("batch", [1, 3])
def test_quant_streaming_same_bits(quantize, batch):
    m = fa_on(gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=37, quantize=quantize))
    prompts = ONE if batch == 1 else PROMPTS
    m._m.quant_streaming = False
    base = run_p(m, True, prompts)
    m._m.quant_streaming = True
    same(base, run_p(m, True, prompts), f"{quantize}: quant_streaming, graph")
    same(base, run_p(m, False, prompts), f"{quantize}: quant_streaming, eager")
    m._m.quant_streaming = False
    same(base, run_p(m, True, prompts), f"{quantize}: quant_streaming off again, graph")


@cuda_only
def test_fused_attention_pad_same_bits():
    # fused_attention_pad_kb only pads the CTAs' shared memory: the same tokens and logits.
    m = gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=41)
    assert m._m.fused_attention_pad_kb == 0
    base = run(m, True, new=20)
    n0 = m._m.fused_attention_layers
    for kb in (200, 227):
        m._m.fused_attention_pad_kb = kb
        same(base, run(m, True, new=20), f"pad {kb} KiB, graph")
        same(base, run(m, False, new=20), f"pad {kb} KiB, eager")
    assert m._m.fused_attention_layers > n0, "the fused attention was not taken"
    m._m.fused_attention_pad_kb = 0


def test_fused_attention_pad_option():
    m = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)
    m._m.fused_attention_pad_kb = 100
    assert m._m.fused_attention_pad_kb == 100
    with pytest.raises(ValueError, match="fused_attention_pad_kb"):
        m._m.fused_attention_pad_kb = 228
