"""The decode runner and the load-time options on the CPU (the CUDA graph itself is
tested in test_llm_graph_gpu.py): generation through the runner equals teacher forcing
through Model.step bit for bit, q/k/v and gate/up are fused at load time without
changing the logits, quantized weights stay close to the float ones, bad options."""
import numpy as np
import pytest

import gpukit as gk
from gpukit import _C

CFG = dict(model_type="llama", vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
           rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
PROMPTS = [[(i * 37 + 11) % 512 for i in range(n)] for n in (5, 14, 30)]


def test_runner_equals_model_step_bits():
    m = gk.llm.random_model(CFG, seed=2)
    g = _C.llm.Generation(m._m, PROMPTS, max_new_tokens=20, ignore_eos=True, temperature=0.7, top_k=40, seed=3)
    steps, logits = [], []
    while not g.done:
        steps.append(list(g.step()))
        logits.append(gk.to_numpy(g.last_logits()))
    assert g.captures == 0
    cache = m._m.make_cache([len(p) + 20 for p in PROMPTS])
    seqs = [cache.add_sequence() for _ in PROMPTS]
    got = gk.to_numpy(m._m.step(cache, seqs, PROMPTS))
    assert np.array_equal(got.view(np.uint32), logits[0].view(np.uint32))
    for t in range(1, len(steps)):
        got = gk.to_numpy(m._m.step(cache, seqs, [[x] for x in steps[t - 1]]))
        assert np.array_equal(got.view(np.uint32), logits[t].view(np.uint32)), f"step {t}"


def test_finish_changes_rows():
    m = gk.llm.random_model(CFG, seed=2)
    g = _C.llm.Generation(m._m, PROMPTS, max_new_tokens=12, ignore_eos=True)
    for _ in range(4):
        g.step()
    g.finish(0)
    while not g.done:
        out = g.step()
        assert out[0] == -1
    assert [len(x) for x in g.generated] == [4, 12, 12]
    ref = m.generate(PROMPTS[1:], max_new_tokens=12, ignore_eos=True).ids
    assert [list(x) for x in g.generated[1:]] == ref


@pytest.mark.parametrize("quantize,tol", [("fp8", 0.08), ("int8", 0.02), ("int4", 0.15)])
def test_quantized_logits_close(quantize, tol):
    ids = PROMPTS[2]
    ref = gk.to_numpy(gk.llm.random_model(CFG, seed=4).forward(ids)).astype(np.float64)
    q = gk.llm.random_model(CFG, seed=4, quantize=quantize)
    assert q.quantized == quantize
    got = gk.to_numpy(q.forward(ids)).astype(np.float64)
    rel = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
    print(f"{quantize}: max relative logit error {rel:.4f}")
    assert rel < tol
    assert rel > 0  # the weights really changed
    # decode through the runner with quantized weights
    out = q.generate([ids], max_new_tokens=5, ignore_eos=True).ids
    assert len(out[0]) == 5


def test_quantized_weights_smaller():
    f = gk.llm.random_model(CFG, dtype="bfloat16", seed=1)
    q = gk.llm.random_model(CFG, dtype="bfloat16", seed=1, quantize="int4")
    assert q._m.nbytes < f._m.nbytes


def test_bad_quantize():
    with pytest.raises(ValueError, match="quantize"):
        gk.llm.random_model(CFG, quantize="int3")
    with pytest.raises(ValueError, match="quantize"):
        _C.llm.Model.random('{"model_type": "llama", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 64,'
                            ' "num_hidden_layers": 1, "num_attention_heads": 1, "head_dim": 64}', quantize="q2")


def test_cuda_graph_option_is_harmless_on_cpu():
    m = gk.llm.random_model(CFG, seed=2, cuda_graph=True)
    a = m.generate(PROMPTS, max_new_tokens=6, ignore_eos=True, cuda_graph=True).ids
    b = m.generate(PROMPTS, max_new_tokens=6, ignore_eos=True, cuda_graph=False).ids
    assert a == b


def test_profile_decode_cpu():
    m = gk.llm.random_model(CFG, seed=2)
    prof = m.profile_decode(batch=2, context=20, reps=1)
    names = [n for n, _, _ in prof]
    assert names.count("qkv") == CFG["num_hidden_layers"] and "lm_head" in names
    with pytest.raises(ValueError):
        m.profile_decode(batch=0)
