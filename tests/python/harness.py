"""The shared op-test harness: every registered op, on the CPU and (where present) CUDA.

Tables
------
Every module ``tests/python/optable/*.py`` exports ``OPS``, a list of :class:`OpSpec`.
An entry declares only how to call the op and its float64 NumPy reference::

    OpSpec(
        name="add",                        # the registry name (gk.registered_ops()); several entries may share it
        fn=lambda a, b: gk.add(a, b),      # calls gpukit on gk.Arrays, returns a gk.Array (or a tuple: see below)
        ref=lambda a, b: a + b,            # float64 NumPy reference on the (already rounded) inputs
        nin=2,                             # number of array inputs (0: see `shape_only` below)
        dtypes=("float32", "bfloat16"),    # the dtype each case is run in; the first gets every layout
        in_dtypes=None,                    # f(dtype) -> dtype name per input (default: all inputs `dtype`)
        out_dtype=None,                    # f(dtype) -> expected result dtype name (default: not checked)
        low=-3.0, high=3.0,                # uniform range of the random inputs
        gen=None,                          # f(rng, shape, dtype_name, input_index) -> float64 values
        layouts=None,                      # subset of LAYOUTS (default: all that make sense for `nin`)
        exact=False,                       # compare bit for bit with the reference rounded to the output dtype
        bitwise_cpu=False,                 # CUDA result must equal the CPU result bit for bit
        ref_dtype=False,                   # ref also gets dtype=<case dtype name> (to round what the op rounds)
        tol=None,                          # {output dtype name: (rtol, atol)} overrides
        covers=(),                         # further registry names this entry exercises ("copy", "fill", ...)
        id=None,                           # case id (default: name)
        shape_only=False,                  # fn/ref receive the inputs only for their shape (fill, arange)
        plan=None,                         # f(layout) -> [(base_shape, view), ...] per input, or None to
                                           # skip the layout: custom input shapes (matmul, reductions)
    )

By default every input of a case has the layout's shape (see _input_plan).  Ops whose inputs
must differ in shape give ``plan``; ``view`` is None (the contiguous base itself), one of
GENERIC_VIEWS ("T": reverse all dims, "step2": [::2] on dim 0, "rev": [::-1] on dim 0,
"offset1": [1:] on dim 0, i.e. contiguous but not 16-byte aligned, "cols_step2": [..., ::2]) or a
pair (gk_view_fn, numpy_view_fn).  A plan item may have a third element, fixed values (array-like of
base_shape) used instead of random ones: index inputs such as positions, block tables or sequence
lengths (give their dtype with ``in_dtypes``; ref receives them as float64 like every input).
With ``plan``, ``layouts`` may name any layouts the plan knows, e.g.::

    def mm_plan(layout):
        return {"small": [((7, 5), None), ((5, 3), None)],
                "transposed": [((5, 7), "T"), ((3, 5), "T")],
                "batched_broadcast": [((2, 1, 7, 5), None), ((4, 5, 3), None)]}.get(layout)
    OpSpec("matmul", lambda a, b: gk.matmul(a, b), np.matmul, nin=2, plan=mm_plan,
           layouts=("small", "transposed", "batched_broadcast"), dtypes=("float32", "bfloat16"))

Several outputs and in-place ops
--------------------------------
``fn`` may return a tuple of gk.Arrays (rms_norm with a residual, topk's values and indices);
``ref`` then returns a tuple of as many references, ``out_dtype`` may give one dtype name per
output, and ``exact`` / ``bitwise_cpu`` may be a tuple of one flag per output.  Every check below
applies to every output.  An op that writes into an input (kv_append, rope(inplace=True)) is
tested by a ``fn`` that copies the destination input (``x.copy()``, so the copy is a poisoned
allocation written in full), runs the op on the copy and returns it: the reference is the whole
expected destination, so elements the op must leave alone are checked too.

What a case checks
------------------
For each entry x dtype x layout x device ("cpu", and "cuda" when ``gk.cuda.is_available()``):

* fresh random inputs (seed printed in the pytest header; set GPUKIT_TEST_SEED to replay),
  rounded to the case dtype by gpukit, so the reference sees exactly the values the op sees;
* layouts: sizes 1, 7, 1023 and 4097, 0-d, 2-d, transposed, stepped slices, reversed
  (negative strides), a contiguous view at an odd offset (not aligned for vector loads), broadcasting (stride-0 views / NumPy broadcasting of operands of
  different shapes) and empty arrays (0 and (3, 0, 5));
* the result's shape, dtype (when declared), and values against the float64 reference within
  the output dtype's tolerance (TOL below; fp8 references are saturated first, NaN must match NaN);
* poisoned outputs and sentinels.  The op API has no ``out=``, so the harness poisons through
  the allocator: ``gk._C._debug_alloc_poison(byte)`` (src/core/allocator.cpp) makes every
  allocation made by the op (its output and any temporaries, on the CPU and on CUDA) come back
  filled with ``byte`` and framed by 256 guard bytes of the same value just before the first and
  just after the last byte.  Each case runs the op twice, with poison 0xFF (NaN for every float
  type) and 0x5A; the two results must be bit-identical (an element the op forgot to write keeps
  the poison and differs between the runs; this also checks determinism), and
  ``gk._C._debug_check_guards()`` must report no overwritten guard byte, neither in the live
  output nor in temporaries freed during the op.  Ops that do take an explicit destination
  (``gk.copy_into``, ``__setitem__``) are also run on an interior strided view of a larger
  poisoned buffer whose untouched elements must keep the poison (see test_ops.py);
* on CUDA, the result is also compared with the CPU result of the same inputs: bit for bit for
  entries with ``bitwise_cpu`` (correctly rounded IEEE operations, integer and boolean ops),
  within the tolerance otherwise.

test_ops.py also fails when a registered op lacks a CPU implementation, lacks a CUDA
implementation in a CUDA build (``gk.cuda.built_with_cuda()``), or has no entry in any table.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
from typing import Callable, Optional

import numpy as np

import gpukit as gk

FLOATS = ("float32", "float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
HALF_FLOATS = ("float32", "float64", "float16", "bfloat16")
SIGNED_INTS = ("int8", "int16", "int32", "int64")
INTS = SIGNED_INTS + ("uint8",)


def same_dtype(dt):
    """out_dtype of the ops whose result keeps the input's dtype."""
    return dt


def float_result_dtype(dt):
    """out_dtype of float functions of one input: floats stay, the others give float32."""
    return dt if dt in FLOATS else "float32"

# (rtol, atol) by output dtype: a few ulps of the type for float32/float64, half an ulp plus
# slack for the narrow types (their results are computed in float32 and rounded once).
TOL = {
    "float64": (1e-12, 1e-13),
    "float32": (1e-5, 1e-6),
    "float16": (1e-3, 1e-4),
    "bfloat16": (1e-2, 1e-3),
    "float8_e4m3fn": (0.07, 2.0 ** -9),   # 3 mantissa bits: half an ulp is 1/16
    "float8_e5m2": (0.13, 2.0 ** -16),    # 2 mantissa bits: half an ulp is 1/8
}
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
POISONS = (0xFF, 0x5A)

# Layout cases: name -> (kind, payload).  Sizes named by the issue come first.
LAYOUTS = ("size1", "size7", "size1023", "size4097", "scalar0d", "2d", "transposed", "stepped",
           "reversed", "offset", "broadcast", "empty", "empty3d")
SECONDARY_LAYOUTS = ("size7", "size4097", "transposed", "offset", "broadcast")  # for the other dtypes


@dataclasses.dataclass
class OpSpec:
    name: str
    fn: Callable
    ref: Callable
    nin: int = 1
    dtypes: tuple = ("float32",)
    in_dtypes: Optional[Callable] = None
    out_dtype: Optional[Callable] = None
    low: float = -3.0
    high: float = 3.0
    gen: Optional[Callable] = None
    layouts: Optional[tuple] = None
    exact: bool = False
    bitwise_cpu: bool = False
    tol: Optional[dict] = None
    covers: tuple = ()
    id: Optional[str] = None
    shape_only: bool = False
    plan: Optional[Callable] = None
    ref_dtype: bool = False

    @property
    def case_id(self):
        return self.id or self.name


@dataclasses.dataclass
class Case:
    spec: OpSpec
    dtype: str
    layout: str

    def __str__(self):
        return f"{self.spec.case_id}-{self.dtype}-{self.layout}"


# ---- tables ----

_TABLE_DIR = pathlib.Path(__file__).resolve().parent / "optable"


def load_tables():
    """All OpSpec entries of tests/python/optable/*.py, in file order."""
    specs = []
    for path in sorted(_TABLE_DIR.glob("*.py")):
        if path.name.startswith("_"):
            continue
        mod_name = f"gk_optable_{path.stem}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        ops = getattr(mod, "OPS", None)
        if not isinstance(ops, list):
            raise TypeError(f"{path}: must export OPS, a list of harness.OpSpec")
        for o in ops:
            if not isinstance(o, OpSpec):
                raise TypeError(f"{path}: OPS entries must be harness.OpSpec, got {type(o).__name__}")
            specs.append(o)
    return specs


def covered_names(specs):
    names = set()
    for s in specs:
        names.add(s.name)
        names.update(s.covers)
    return names


def collect_cases(specs):
    cases = []
    for s in specs:
        layouts = s.layouts or _default_layouts(s)
        if s.plan is not None:
            layouts = [lay for lay in layouts if s.plan(lay) is not None]
        for i, dt in enumerate(s.dtypes):
            for lay in layouts:
                if i > 0 and s.plan is None and lay not in SECONDARY_LAYOUTS:
                    continue
                cases.append(Case(s, dt, lay))
    return cases


def _default_layouts(s):
    if s.shape_only:
        return ("size1", "size7", "size1023", "size4097", "empty")
    return LAYOUTS


# ---- inputs ----

def to_cuda(x):
    """A contiguous copy of the NumPy array x as a gk.Array on the CUDA device."""
    return gk.asarray(np.ascontiguousarray(x)).to("cuda")


def to_host(x):
    """A contiguous copy of the NumPy array x as a gk.Array on the CPU."""
    return gk.asarray(np.ascontiguousarray(x))


def to_np(x):
    """x (a gk.Array on any device) as a NumPy array."""
    return gk.to_numpy(x)


def seed():
    return int(os.environ.get("GPUKIT_TEST_SEED", _SESSION_SEED))


_SESSION_SEED = int.from_bytes(os.urandom(4), "little")


GENERIC_VIEWS = {
    "T": (lambda a: a.T, lambda a: a.T),
    "step2": (lambda a: a[::2], lambda a: a[::2]),
    "rev": (lambda a: a[::-1], lambda a: a[::-1]),
    "offset1": (lambda a: a[1:], lambda a: a[1:]),
    "cols_step2": (lambda a: a[..., ::2], lambda a: a[..., ::2]),
}


def _view_fns(view):
    if isinstance(view, tuple):
        return view
    if view in GENERIC_VIEWS:
        return GENERIC_VIEWS[view]
    return _VIEWS[view][:2]


def _np_view(base, view):
    """The NumPy equivalent of _gk_view (same view of the same base)."""
    return _view_fns(view)[1](base)


def _gk_view(base, view):
    return _view_fns(view)[0](base)


# layout -> (gk view fn, numpy view fn, base shape) for one input.
_VIEWS = {
    "transposed": (lambda a: a.T, lambda a: a.T, (33, 17)),
    "stepped": (lambda a: a[::2, 1::3], lambda a: a[::2, 1::3], (34, 70)),
    "reversed": (lambda a: a[::-1], lambda a: a[::-1], (1023,)),
    "offset": (lambda a: a[1:], lambda a: a[1:], (4098,)),  # contiguous but not 16-byte aligned
    "broadcast1": (lambda a: a.broadcast_to((17, 33)), lambda a: np.broadcast_to(a, (17, 33)), (1, 33)),
}


def _input_plan(nin, layout):
    """For each input: (base shape, view key or None)."""
    simple = {"size1": (1,), "size7": (7,), "size1023": (1023,), "size4097": (4097,), "scalar0d": (),
              "2d": (17, 33), "empty": (0,), "empty3d": (3, 0, 5)}
    if layout in simple:
        return [(simple[layout], None)] * nin
    if layout in ("transposed", "stepped", "reversed", "offset"):
        # the first input is the view; the others contiguous arrays of the view's shape
        out_shape = {"transposed": (17, 33), "stepped": (17, 23), "reversed": (1023,), "offset": (4097,)}[layout]
        return [(_VIEWS[layout][2], layout)] + [(out_shape, None)] * (nin - 1)
    if layout == "broadcast":
        if nin == 1:
            return [((1, 33), "broadcast1")]
        if nin == 2:
            return [((7, 1, 5), None), ((4, 5), None)]
        return [((4, 1), None), ((1, 5), None), ((), None)] + [((5,), None)] * (nin - 3)
    raise ValueError(layout)


def _values(spec, rng, shape, dtype, index):
    if spec.gen is not None:
        v = np.asarray(spec.gen(rng, shape, dtype, index), dtype=np.float64)
        return v.reshape(shape)
    if dtype == "bool":
        return (rng.random(shape) < 0.5).astype(np.float64)
    if dtype in INTS:
        lo, hi = (0, 15) if dtype == "uint8" else (-10, 10)
        return rng.integers(lo, hi + 1, size=shape).astype(np.float64)
    return rng.uniform(spec.low, spec.high, size=shape)


def make_inputs(case, rng, device):
    """gk inputs on `device` and their float64 NumPy twins (same views, same rounded values)."""
    spec = case.spec
    in_dt = spec.in_dtypes(case.dtype) if spec.in_dtypes else (case.dtype,) * spec.nin
    xs, refs = [], []
    plan = spec.plan(case.layout) if spec.plan else _input_plan(spec.nin, case.layout)
    assert len(plan) == spec.nin, f"{case}: the plan gives {len(plan)} inputs, nin is {spec.nin}"
    for i, item in enumerate(plan):
        base_shape, view = item[0], item[1]
        if len(item) > 2:  # fixed values (index inputs)
            vals = np.asarray(item[2], dtype=np.float64)
            assert vals.shape == tuple(base_shape), f"{case}: fixed input {i} has shape {vals.shape}, not {base_shape}"
        else:
            vals = _values(spec, rng, base_shape, in_dt[i], i)
        base = gk.asarray(np.ascontiguousarray(vals)).astype(in_dt[i])
        rounded = base.astype("float64").numpy()
        base = base.to(device)
        if view:
            xs.append(_gk_view(base, view))
            refs.append(_np_view(rounded, view))
        else:
            xs.append(base)
            refs.append(rounded)
    return xs, refs


# ---- running and comparing ----

def bits(x):
    """The raw bits of a gk.Array as a NumPy unsigned array (copied to the host)."""
    u = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}[x.itemsize]
    v = x.contiguous()
    v = v.view_dtype(u) if x.ndim else v.reshape(1).view_dtype(u).reshape(())
    return np.array(v.to("cpu").numpy(), copy=True)


def values(x):
    return np.array(x.astype("float64").to("cpu").numpy(), copy=True)


def run_poisoned(fn, *args):
    """Runs fn(*args) once per poison byte; returns the results and the guard violations."""
    outs, violations = [], []
    gk._C._debug_check_guards()  # clear what earlier code left
    for p in POISONS:
        gk._C._debug_alloc_poison(p)
        try:
            outs.append(fn(*args))
        finally:
            gk._C._debug_alloc_poison(-1)
        violations += gk._C._debug_check_guards()
    return outs, violations


def _dtype_name(t):
    return gk._C.dtype_name(t)


def check_close(got, want, out_dtype, spec, what, exact=None):
    """got, want: float64 arrays; raises AssertionError with the worst element.
    exact: None for spec.exact (the flag of the output being checked, for several outputs)."""
    if exact is None:
        exact = spec.exact
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if out_dtype in FP8_MAX:
        m = FP8_MAX[out_dtype]
        want = np.where(np.isnan(want), want, np.clip(want, -m, m))
    if exact or out_dtype not in TOL:
        ok = (got == want) | (np.isnan(got) & np.isnan(want))
    else:
        rtol, atol = (spec.tol or {}).get(out_dtype, TOL[out_dtype])
        with np.errstate(invalid="ignore"):
            ok = np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
            ok |= (got == want)  # equal infinities
    if not ok.all():
        idx = np.argwhere(~ok)
        first = tuple(int(i) for i in idx[0]) if got.ndim else ()
        raise AssertionError(
            f"{what}: {idx.shape[0]} of {got.size} elements differ; first at {first}: "
            f"got {got[first]!r}, want {want[first]!r} (output dtype {out_dtype})")


def _flag(value, i):
    """A per-output flag: a bool for every output, or a tuple of one per output."""
    return value[i] if isinstance(value, (tuple, list)) else value


def _outputs(result, what):
    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    assert outs, f"{what}: fn returned no outputs"
    for o in outs:
        assert isinstance(o, gk.Array), f"{what}: fn returned {type(o).__name__}"
    return outs


def run_case(case, device, rng):
    spec = case.spec
    xs, refs = make_inputs(case, rng, device)
    (res, res2), violations = run_poisoned(spec.fn, *xs)
    assert not violations, f"{case} on {device}: guard bytes overwritten: {violations}"
    outs, outs2 = _outputs(res, str(case)), _outputs(res2, str(case))
    with np.errstate(all="ignore"):
        wants = spec.ref(*refs, dtype=case.dtype) if spec.ref_dtype else spec.ref(*refs)
    wants = list(wants) if isinstance(res, (tuple, list)) else [wants]
    assert len(wants) == len(outs), f"{case}: fn gives {len(outs)} outputs, ref {len(wants)}"
    want_dts = spec.out_dtype(case.dtype) if spec.out_dtype is not None else None
    if isinstance(want_dts, str) or want_dts is None:
        want_dts = [want_dts] * len(outs)
    for i, (out, out2, want) in enumerate(zip(outs, outs2, wants)):
        tag = f"{case} output {i}" if len(outs) > 1 else str(case)
        out_dt = _dtype_name(out.dtype)
        if want_dts[i] is not None:
            assert out_dt == want_dts[i], f"{tag}: result dtype {out_dt}, want {want_dts[i]}"
        assert out.device == device, f"{tag}: result on {out.device}, want {device}"
        b1, b2 = bits(out), bits(out2)
        assert np.array_equal(b1, b2), (
            f"{tag} on {device}: results differ between poison bytes {POISONS} "
            f"(unwritten output elements or nondeterminism) at {np.argwhere(b1 != b2)[:5].tolist()}")
        with np.errstate(all="ignore"):
            want = np.asarray(want, dtype=np.float64)
        check_close(values(out), want, out_dt, spec, f"{tag} on {device} vs float64 NumPy", _flag(spec.exact, i))
    return res, xs


def run_case_cuda_vs_cpu(case, rng):
    """Runs the case on CUDA (all checks of run_case) and compares with the CPU on the same inputs."""
    res, xs = run_case(case, "cuda", rng)
    outs = _outputs(res, str(case))
    cpu_outs = _outputs(case.spec.fn(*[x.to("cpu") for x in xs]), str(case))
    for i, (out, cpu_out) in enumerate(zip(outs, cpu_outs)):
        tag = f"{case} output {i}" if len(outs) > 1 else str(case)
        if _flag(case.spec.bitwise_cpu, i) or _flag(case.spec.exact, i):
            b_gpu, b_cpu = bits(out), bits(cpu_out)
            assert np.array_equal(b_gpu, b_cpu), (
                f"{tag}: CUDA and CPU results differ bitwise at {np.argwhere(b_gpu != b_cpu)[:5].tolist()}")
        else:
            check_close(values(out), values(cpu_out), _dtype_name(out.dtype), case.spec, f"{tag}: CUDA vs CPU",
                        _flag(case.spec.exact, i))
