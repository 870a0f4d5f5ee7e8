"""Op-table entries of the LLM engine's ops (format: tests/python/harness.py).
Bad input and dtype cases of embedding live in test_llm.py."""
import numpy as np

import gpukit as gk
from harness import OpSpec

VOCAB = 11


def _emb_plan(layout):
    return {"ids1d": [((7,), None), ((VOCAB, 5), None)],
            "ids2d": [((3, 4), None), ((VOCAB, 33), None)],
            "table_rows_step2": [((9,), None), ((2 * VOCAB, 6), "step2")],
            "empty": [((0,), None), ((VOCAB, 4), None)]}.get(layout)


def _emb_gen(rng, shape, dtype, index):
    if index == 0:
        return rng.integers(0, VOCAB, size=shape)
    return rng.uniform(-3, 3, size=shape)


OPS = [
    OpSpec("embedding", lambda ids, table: gk.embedding(ids, table),
           lambda ids, table: table[ids.astype(np.int64)], nin=2, plan=_emb_plan, gen=_emb_gen,
           layouts=("ids1d", "ids2d", "table_rows_step2", "empty"),
           dtypes=("float32", "bfloat16", "float16", "float64"), in_dtypes=lambda dt: ("int32", dt),
           out_dtype=lambda dt: dt, exact=True, bitwise_cpu=True),
    OpSpec("embedding", lambda ids, table: gk.embedding(ids, table),
           lambda ids, table: table[ids.astype(np.int64)], nin=2, plan=_emb_plan, gen=_emb_gen,
           layouts=("ids1d", "ids2d"), id="embedding_int64", dtypes=("float32",),
           in_dtypes=lambda dt: ("int64", dt), out_dtype=lambda dt: dt, exact=True, bitwise_cpu=True),
]
