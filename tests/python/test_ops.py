"""Runs every op-table entry (tests/python/optable/*.py) through the harness; see harness.py."""
import ctypes

import numpy as np
import pytest

import gpukit as gk
import harness
from conftest import needs_cuda

SPECS = harness.load_tables()
CASES = harness.collect_cases(SPECS)


def test_tables_load():
    assert SPECS, "no op-table entries found in tests/python/optable"


def test_every_registered_op_has_both_backends_and_a_table_entry():
    ops = gk.registered_ops()
    assert ops, "gk.registered_ops() is empty"
    names = {n for n, _, _ in ops}
    no_cpu = sorted(n for n, cpu, _ in ops if not cpu)
    no_cuda = sorted(n for n, _, cu in ops if not cu) if gk.cuda.built_with_cuda() else []
    no_entry = sorted(names - harness.covered_names(SPECS))
    unknown = sorted(harness.covered_names(SPECS) - names)
    problems = []
    if no_cpu:
        problems.append(f"registered ops without a CPU implementation: {no_cpu}")
    if no_cuda:
        problems.append(f"registered ops without a CUDA implementation (CUDA build): {no_cuda}")
    if no_entry:
        problems.append(f"registered ops without an op-table entry: {no_entry}")
    if unknown:
        problems.append(f"op-table entries naming ops that are not registered: {unknown}")
    assert not problems, "; ".join(problems)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_op_cpu(case, rng):
    harness.run_case(case, "cpu", rng)


@needs_cuda
@pytest.mark.parametrize("case", CASES, ids=str)
def test_op_cuda(case, rng):
    harness.run_case_cuda_vs_cpu(case, rng)


# ---- explicit destinations: sentinels around an interior strided view ----

@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int16", "float64", "float8_e4m3fn"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_copy_into_view_keeps_sentinels(dtype, device, rng):
    itemsize = getattr(gk, dtype if dtype != "bool" else "bool_").itemsize
    raw = gk.full((20, 40 * itemsize), 0xA5, dtype="uint8", device=device)
    frame = raw.view_dtype(dtype)                    # (20, 40) of dtype, every byte 0xA5
    before = harness.bits(frame)
    dst = frame[3:17:2, 5:35:3]                      # interior, strided in both dims
    vals = rng.uniform(-3, 3, size=dst.shape)
    src = gk.asarray(vals).astype(dtype).to(device)
    gk.copy_into(dst, src)
    after = harness.bits(frame)
    mask = np.zeros(after.shape, dtype=bool)
    mask[3:17:2, 5:35:3] = True
    assert np.array_equal(after[~mask], before[~mask]), "copy_into wrote outside its destination view"
    assert np.array_equal(harness.bits(dst), harness.bits(src)), "copy_into did not write the view"
    # broadcasting a row into the view, then a scalar via __setitem__
    row = gk.asarray(rng.uniform(-3, 3, size=(dst.shape[1],))).astype(dtype).to(device)
    gk.copy_into(dst, row)
    frame[3:17:2, 5:35:3] = 1
    after = harness.bits(frame)
    assert np.array_equal(after[~mask], before[~mask]), "setitem wrote outside its destination view"
    np.testing.assert_array_equal(harness.values(dst), np.ones(dst.shape))


def _poke_byte(device, address, value):
    """Writes one byte at `address` (host or device memory that the test owns)."""
    if device == "cpu":
        ctypes.memset(address, value, 1)
    else:
        lib = ctypes.CDLL("libcuda.so.1")
        gk.cuda.synchronize()
        assert lib.cuMemsetD8_v2(ctypes.c_uint64(address), ctypes.c_ubyte(value), ctypes.c_size_t(1)) == 0
        gk.cuda.synchronize()


@pytest.mark.parametrize("where", ["after", "before"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_guard_hook_can_fail(device, where):
    """The guard check sees a write one byte past the end (or before the start) of an allocation,
    and unwritten elements of a poisoned allocation read as the poison (NaN)."""
    gk._C._debug_check_guards()
    gk._C._debug_alloc_poison(0xFF)
    try:
        a = gk.empty((7,), dtype="float32", device=device)
    finally:
        gk._C._debug_alloc_poison(-1)
    assert np.isnan(harness.values(a)).all()
    assert gk._C._debug_check_guards() == []
    _poke_byte(device, a.data_ptr() + (28 if where == "after" else -1), 0)
    v = gk._C._debug_check_guards()
    assert len(v) == 1 and "overwritten" in v[0], v
    del a  # checked again when freed
    v = gk._C._debug_check_guards()
    assert len(v) == 1, v


@needs_cuda
def test_cuda_matches_cpu_bitwise_for_ieee_ops(rng):
    """A direct CUDA-vs-CPU check on a large odd size for the correctly rounded ops."""
    x = rng.uniform(-3, 3, size=(4097,)).astype(np.float32)
    y = rng.uniform(0.5, 3, size=(4097,)).astype(np.float32)
    for f in (gk.add, gk.sub, gk.mul, gk.div):
        c = f(gk.asarray(x), gk.asarray(y)).numpy()
        g = f(gk.asarray(x, device="cuda"), gk.asarray(y, device="cuda")).numpy()
        assert np.array_equal(c.view(np.uint32), g.view(np.uint32)), f.__name__
