"""bench/e2e_trace.py's engine_applied (shared with bench/gemv_stamps.py since session 11): inside it a model carries
the options of the gk engine named (its attributes and other areas' environment knobs), afterwards what it had.
No GPU: a CPU model, the context entered and left."""
import os
import sys

import gpukit as gk
from bench_ref import ROOT

CFG = dict(model_type="llama", vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def _e2e_trace():
    bench = str(ROOT / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import e2e_trace
    return e2e_trace


def test_engine_applied_sets_and_restores():
    tr = _e2e_trace()
    m = gk.llm.random_model(CFG, seed=3)
    chunk, wide, fusion = m._m.fused_attention_chunk, m._m.fused_attention_wide, m._m.fusion
    assert "GPUKIT_GEMV_W8_SMALL" not in os.environ
    with tr.engine_applied(m, "gk-graph+fac64+faw2+w8s4-2-14-1-3-0-0") as opt:
        assert opt["graph"]
        assert m._m.fused_attention_chunk == 64 and m._m.fused_attention_wide == 2
        assert os.environ["GPUKIT_GEMV_W8_SMALL"] == "4,2,14,1,3,0,0"
    assert (m._m.fused_attention_chunk, m._m.fused_attention_wide, m._m.fusion) == (chunk, wide, fusion)
    assert "GPUKIT_GEMV_W8_SMALL" not in os.environ
    try:
        with tr.engine_applied(m, "gk-graph+fac64"):
            raise RuntimeError("inside")
    except RuntimeError:
        pass
    assert m._m.fused_attention_chunk == chunk, "not restored after an exception"
