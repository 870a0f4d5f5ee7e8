"""CI parity without torch: the tiny models and transformers float32 logits that
scripts/llm_parity.py --write-refs tests/data/llm_ref saved (skipped until they exist).
Batch prefill of all prompts, then batched decode steps, against the saved logits."""
import os

import numpy as np
import pytest

import gpukit as gk

REF_DIR = os.path.join(os.path.dirname(__file__), "..", "data", "llm_ref")
CASES = sorted(d for d in os.listdir(REF_DIR)) if os.path.isdir(REF_DIR) else []


@pytest.mark.skipif(not CASES, reason="no saved transformers references (scripts/llm_parity.py --write-refs)")
@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers(case):
    d = os.path.join(REF_DIR, case)
    ref = np.load(os.path.join(d, "reference.npz"))
    lens = ref["prompt_lengths"].tolist()
    seqs = [ref[f"prompt{b}"].tolist() for b in range(len(lens))]
    m = gk.llm.load(d)._m
    cache = m.make_cache([len(s) for s in seqs])
    ids = [cache.add_sequence() for _ in seqs]
    got = gk.to_numpy(m.step(cache, ids, [s[:n] for s, n in zip(seqs, lens)], all_logits=True))
    at = 0
    for b, n in enumerate(lens):
        want = ref[f"logits{b}"][:n].astype(np.float64)
        assert np.max(np.abs(got[at:at + n] - want)) / np.max(np.abs(want)) < 1e-4
        at += n
    steps = len(seqs[0]) - lens[0]
    for j in range(steps):
        got = gk.to_numpy(m.step(cache, ids, [[s[n + j]] for s, n in zip(seqs, lens)]))
        for b, n in enumerate(lens):
            want = ref[f"logits{b}"][n + j].astype(np.float64)
            assert np.max(np.abs(got[b] - want)) / np.max(np.abs(want)) < 1e-4, (case, b, j)
