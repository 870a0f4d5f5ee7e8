"""The decode step replayed from a CUDA graph gives the same bits as eager execution
(skipped without a GPU): tokens and float32 logits of every step, greedy and seeded
sampling, a batch of sequences of different lengths crossing page boundaries, a batch
that changes composition (re-capture), quantized weights; and the graph path against
Model.step's decode (teacher forcing)."""
import numpy as np
import pytest

import gpukit as gk
from gpukit import _C

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="no CUDA device")

CFG = dict(model_type="llama", vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
           rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
PROMPTS = [[(i * 37 + 11) % 512 for i in range(n)] for n in (5, 14, 30)]  # pages of 16: boundaries crossed
SAMPLING = {"greedy": dict(temperature=0.0), "seeded": dict(temperature=0.8, top_k=50, top_p=0.9, seed=7)}


def run(model, graph, sampling, new=40, finish_at=None, lookahead=True):
    # With lookahead a graph's logits buffer already holds the next step's logits when
    # a step returns: logits are compared from runs without lookahead.
    g = _C.llm.Generation(model._m, PROMPTS, max_new_tokens=new, ignore_eos=True, cuda_graph=graph,
                          lookahead=lookahead, **sampling)
    steps, logits = [], []
    while not g.done:
        steps.append(list(g.step()))
        logits.append(np.asarray(gk.to_numpy(g.last_logits()), np.float32))
        if finish_at is not None and len(steps) == finish_at:
            g.finish(1)  # a composition change: the graph is captured again
    return steps, logits, g


def first_mismatch(a, b):
    if a.shape != b.shape:
        return f"shapes {a.shape} vs {b.shape}"
    ua, ub = a.view(np.uint32), b.view(np.uint32)
    bad = np.argwhere(ua != ub)
    if bad.size == 0:
        return None
    i = tuple(bad[0])
    return (f"{len(bad)} differing values, first at {i}: {a[i]!r} vs {b[i]!r}; "
            f"max |diff| {float(np.max(np.abs(a.astype(np.float64) - b))):.3g}")


def assert_same(eager, graph, logits=True):
    se, le, _ = eager
    sg, lg, _ = graph
    assert len(se) == len(sg), (len(se), len(sg))
    for t, (a, b) in enumerate(zip(se, sg)):
        assert a == b, f"step {t}: eager tokens {a} vs graph {b}"
    if not logits:
        return
    for t, (a, b) in enumerate(zip(le, lg)):
        msg = first_mismatch(a, b)
        assert msg is None, f"step {t} logits: {msg}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("mode", list(SAMPLING))
def test_graph_equals_eager(dtype, mode):
    m = gk.llm.random_model(CFG, device="cuda", dtype=dtype, seed=3)
    eager = run(m, False, SAMPLING[mode])  # eager steps make new logits arrays: exact with lookahead
    graph = run(m, True, SAMPLING[mode], lookahead=False)
    assert eager[2].captures == 0 and graph[2].captures == 1, (eager[2].captures, graph[2].captures)
    assert_same(eager, graph)
    assert all(len(x) == 40 for x in graph[2].generated)
    assert_same(eager, run(m, True, SAMPLING[mode]), logits=False)  # graph + lookahead: the same tokens
    assert_same(eager, run(m, False, SAMPLING[mode], lookahead=False))


def test_graph_recapture_on_finish():
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=5)
    eager = run(m, False, SAMPLING["seeded"], finish_at=9)
    graph = run(m, True, SAMPLING["seeded"], finish_at=9, lookahead=False)
    assert graph[2].captures == 2, graph[2].captures
    assert_same(eager, graph)
    ahead = run(m, True, SAMPLING["seeded"], finish_at=9)  # a speculative step is dropped at the change
    assert ahead[2].captures == 2
    assert_same(eager, ahead, logits=False)
    assert len(graph[2].generated[1]) == 9 and graph[2].finish_reasons[1] == "stop"


@pytest.mark.parametrize("quantize", ["fp8", "int8", "int4"])
def test_graph_equals_eager_quantized(quantize):
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=3, quantize=quantize)
    assert m.quantized == quantize
    assert_same(run(m, False, SAMPLING["greedy"], new=20), run(m, True, SAMPLING["greedy"], new=20, lookahead=False))


def test_graph_equals_model_step():
    # Teacher forcing through Model.step (its own eager decode with a narrower block
    # table) gives the same logits bits as the graph replays.
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=9)
    steps, logits, g = run(m, True, SAMPLING["greedy"], new=24, lookahead=False)
    cache = m._m.make_cache([len(p) + 24 for p in PROMPTS])
    seqs = [cache.add_sequence() for _ in PROMPTS]
    first = gk.to_numpy(m._m.step(cache, seqs, PROMPTS))
    msg = first_mismatch(np.asarray(first, np.float32), logits[0])
    assert msg is None, f"prefill logits: {msg}"
    for t in range(1, len(steps)):
        got = np.asarray(gk.to_numpy(m._m.step(cache, seqs, [[x] for x in steps[t - 1]])), np.float32)
        msg = first_mismatch(got, logits[t])
        assert msg is None, f"decode step {t}: {msg}"


def test_graph_generate_api_and_toggle():
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=1)
    assert m.cuda_graph
    a = m.generate(PROMPTS, max_new_tokens=20, ignore_eos=True).ids
    m.cuda_graph = False
    b = m.generate(PROMPTS, max_new_tokens=20, ignore_eos=True).ids
    assert a == b


def test_profile_decode_names_every_op():
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=1)
    m._m.fusion = 1  # the gk.nn ops (level 2's names: test_llm_fused.py)
    prof = m.profile_decode(batch=2, context=40, reps=2)
    names = {n for n, _, _ in prof}
    assert {"embed", "qkv", "rope", "kv_append", "attention", "o_proj", "gate_up", "swiglu", "down",
            "lm_head"} <= names, names
    assert all(ms >= 0 for _, _, ms in prof)
    print("\nprofile:", [(n, l, round(ms * 1e3, 1)) for n, l, ms in prof][:14])


@pytest.mark.parametrize("quantize", ["fp8", "int8", "int4"])
def test_quantized_cuda_matches_cpu(quantize):
    # The same quantized weights on CUDA (bf16 activations, gemv_quantized kernels; the
    # prefill runs the GEMV per 8 rows) and on the CPU (float32 model, the reference).
    ids = PROMPTS[2]
    cpu = gk.to_numpy(gk.llm.random_model(CFG, seed=4, quantize=quantize).forward(ids)).astype(np.float64)
    gpu = gk.to_numpy(gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=4,
                                          quantize=quantize).forward(ids)).astype(np.float64)
    rel = float(np.max(np.abs(gpu - cpu)) / np.max(np.abs(cpu)))
    print(f"\n{quantize}: CUDA bf16 vs CPU float32 logits, max relative error {rel:.4f}")
    assert rel < 5e-2
    out = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=4, quantize=quantize).generate(
        [ids], max_new_tokens=4, ignore_eos=True)
    assert len(out.ids[0]) == 4
