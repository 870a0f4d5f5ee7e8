"""Engine decode options of session 6 (src/llm, src/cuda/llm_*.cu): each only moves work or
sets a cache hint, so the tokens and logits keep their bits (graph and eager, one sequence,
where the batch-1 kernels run, and three). CUDA parts skip without a GPU."""
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
    m = gk.llm.random_model(CFG if cfg == "64" else CFG128, device="cuda", dtype="bfloat16", seed=23)
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
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=29, quantize="int4")
    base = run_p(m, True, ONE)
    m._m.weights_evict_first = True
    same(base, run_p(m, True, ONE), "int4, weights_evict_first, graph")
