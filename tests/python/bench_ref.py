"""Helpers shared by the tests that check the benchmarks' switches without a GPU: bench/e2e_engines.py (the gk
engine options of bench/e2e.py) loaded by path, bench/gemv.py's variant lists read without importing it (the
bench needs a GPU), and the GEMV variant bound of gk._C._gemv_set_variant."""
import ast
import importlib.util
import pathlib

import pytest

import gpukit as gk

ROOT = pathlib.Path(__file__).resolve().parents[2]


def e2e_engines():
    """The module bench/e2e_engines.py (gk_engine, engine_env, ...), loaded by path (it imports nothing of bench/)."""
    spec = importlib.util.spec_from_file_location("gk_bench_e2e_engines", ROOT / "bench" / "e2e_engines.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bench_gemv_lists():
    """bench/gemv.py's INT4_ONLY_VARIANTS and W4_VARIANT_NAMES (module-level literals), by name."""
    tree = ast.parse((ROOT / "bench" / "gemv.py").read_text())
    vals = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("INT4_ONLY_VARIANTS", "W4_VARIANT_NAMES"):
                vals[node.targets[0].id] = ast.literal_eval(node.value)
    return vals


def check_variant_bound(top, refused):
    """gk._C._gemv_set_variant takes 0..top and refuses every value of `refused`; the variant is 0 afterwards."""
    try:
        for v in range(top + 1):
            gk._C._gemv_set_variant(v)
        for v in refused:
            with pytest.raises(ValueError, match="variant"):
                gk._C._gemv_set_variant(v)
    finally:
        gk._C._gemv_set_variant(0)
