"""The short-projection switches of the decode GEMVs (session 10; benchmarking switches for the engine):
GPUKIT_GEMV_W8_SMALL (GPUKIT_GEMV_W8's fields, for 8-bit weights of at most 32 MiB) and GPUKIT_GEMV_W4_SMALL (a
variant of the staged 4-bit GEMV, for at most 32 Mi weights), their session-11 companions GPUKIT_GEMV_W8_O /
GPUKIT_GEMV_W4_O (the same for at most 16 MiB / 16 Mi: the 8B o projection apart from q/k/v), and bench/e2e.py's
engine options +w8s... / +w4s... / +w8o... / +w4o... that set them. On the GPU: a bad value is refused only where the switch applies (so the size gate is the one
documented), and a good value gives results within the default's float64 bound. The e2e options: no GPU."""
import contextlib
import math

import numpy as np
import pytest

import gpukit as gk
from bench_ref import e2e_engines
from w4_ref import check_default, check_exact, f64, make_w4, make_x, same_bits

RNG = np.random.default_rng(1010)
cuda_only = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")


def test_e2e_options_set_the_switches():
    e2e = e2e_engines()
    base, opt = e2e.gk_engine("gk-graph+w8s4-3-16-1-3-0-0")
    assert base == "gk-graph" and opt["env"] == {"GPUKIT_GEMV_W8_SMALL": "4,3,16,1,3,0,0"}
    base, opt = e2e.gk_engine("gk-graph+w4s53")
    assert base == "gk-graph" and opt["env"] == {"GPUKIT_GEMV_W4_SMALL": "53"}
    both = e2e.gk_engine("gk-graph+w4s48+w8s4-2-24")[1]["env"]
    assert both == {"GPUKIT_GEMV_W4_SMALL": "48", "GPUKIT_GEMV_W8_SMALL": "4,2,24"}
    knob = e2e.gk_engine("gk-graph+w8k4-2-16-1-3-0-0")[1]["env"]
    assert knob == {"GPUKIT_GEMV_W8": "4,2,16,1,3,0,0"}
    w4o = e2e.gk_engine("gk-graph+w4s54+w4o48")[1]["env"]
    assert w4o == {"GPUKIT_GEMV_W4_SMALL": "54", "GPUKIT_GEMV_W4_O": "48"}
    o = e2e.gk_engine("gk-graph+w8s8-2-16-1-3-0-0+w8o4-2-16-1-3-0-0")[1]["env"]
    assert o == {"GPUKIT_GEMV_W8_SMALL": "8,2,16,1,3,0,0", "GPUKIT_GEMV_W8_O": "4,2,16,1,3,0,0"}
    env = e2e.gk_engine("gk-graph")[1]["env"]
    assert "GPUKIT_GEMV_W8_SMALL" not in env and "GPUKIT_GEMV_W4_SMALL" not in env


@contextlib.contextmanager
def _env(name, value):
    """The environment variable `name` set to `value` inside the block, restored after it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        yield


def _w8(fmt, n, k):
    w = (RNG.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
    q, s = getattr(gk, f"quantize_{fmt}")(gk.asarray(w))
    qc, sc = q.to("cuda"), s.to("cuda")
    fn = getattr(gk, f"gemv_{fmt}")
    return (lambda x: fn(x, qc, sc, out_dtype="float32")), f64(getattr(gk, f"dequantize_{fmt}")(q, s))


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_w8_small_gate_and_results(fmt):
    """32 MiB gate: (6144, 4096) and (4096, 4096) take the switch (a bad value is refused), (4096, 14336) = 56 MiB
    does not; valid values (ring of 3, ring of 4, 24 warps per SM, stages of 2 blocks) stay within the bound at
    M = 1 and M = 3, odd N included."""
    x, xs = make_x(RNG, 4096, "bfloat16", m=3)
    for n in (6144, 4096, 1001):
        fn, deq = _w8(fmt, n, 4096)
        with _env("GPUKIT_GEMV_W8_SMALL", "nonsense"):
            with pytest.raises(ValueError, match="GPUKIT_GEMV_W8_SMALL"):
                fn(x)
        for cfg in ("4,3,16,1,3,0,0", "4,4,16,1,3,0,0", "4,2,24,1,3,0,0", "2,4,16,1,3,0,0"):
            with _env("GPUKIT_GEMV_W8_SMALL", cfg):
                check_exact(f"{fmt} n {n} cfg {cfg} M=3", fn(x), xs, deq)
                check_exact(f"{fmt} n {n} cfg {cfg} M=1", fn(x[:1]), xs[:1], deq)
    xb, xbs = make_x(RNG, 14336, "bfloat16", m=1)
    fn, deq = _w8(fmt, 4096, 14336)
    with _env("GPUKIT_GEMV_W8_SMALL", "nonsense"):
        check_exact(f"{fmt} (4096, 14336): the switch does not apply", fn(xb), xbs, deq)


@cuda_only
def test_w4_small_gate_and_results():
    """int4 g128 with bf16 x: (6144, 4096) takes GPUKIT_GEMV_W4_SMALL (a bad value is refused), (4096, 14336) = 56 Mi
    weights does not; variants 48, 52-55, 57, 58 and 60 as the small variant stay within the bound; the process
    variant and GPUKIT_GEMV_W4_VARIANT take precedence (a bad small value is not read then)."""
    fn, deq = make_w4(RNG, "int4_128", 6144, 4096)
    x, xs = make_x(RNG, 4096, "bfloat16", m=2)
    with _env("GPUKIT_GEMV_W4_SMALL", "7"):
        with pytest.raises(ValueError, match="GPUKIT_GEMV_W4_SMALL"):
            fn(x, out_dtype="float32")
        with _env("GPUKIT_GEMV_W4_VARIANT", "48"):
            check_exact("GPUKIT_GEMV_W4_VARIANT first", fn(x, out_dtype="float32"), xs, deq)
    for v in ("48", "52", "53", "54", "55", "57", "58", "60"):
        with _env("GPUKIT_GEMV_W4_SMALL", v):
            check_exact(f"small variant {v} M=2", fn(x, out_dtype="float32"), xs, deq)
            check_exact(f"small variant {v} M=1", fn(x[:1], out_dtype="float32"), xs[:1], deq)
    fb, deqb = make_w4(RNG, "int4_128", 4096, 14336)
    xb, xbs = make_x(RNG, 14336, "bfloat16", m=1)
    with _env("GPUKIT_GEMV_W4_SMALL", "7"):
        # the default (k_w4i since session 15): its own bound
        check_default("(4096, 14336): the switch does not apply", fb(xb, out_dtype="float32"), xbs, deqb, True)


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_w8_o_gate(fmt):
    """GPUKIT_GEMV_W8_O (session 11) applies up to 16 MiB only: (4096, 4096) refuses a bad value even with a valid
    GPUKIT_GEMV_W8_SMALL (it is read first), (6144, 4096) does not read it; a valid value stays within the bound."""
    x, xs = make_x(RNG, 4096, "bfloat16", m=3)
    fo, deqo = _w8(fmt, 4096, 4096)
    with _env("GPUKIT_GEMV_W8_SMALL", "4,3,16,1,3,0,0"), _env("GPUKIT_GEMV_W8_O", "nonsense"):
        with pytest.raises(ValueError, match="GPUKIT_GEMV_W8_O"):
            fo(x)
    fq, deqq = _w8(fmt, 6144, 4096)
    with _env("GPUKIT_GEMV_W8_O", "nonsense"):
        check_exact(f"{fmt} (6144, 4096): GPUKIT_GEMV_W8_O does not apply", fq(x), xs, deqq)
    for cfg in ("8,2,16,1,3,0,0", "4,3,16,1,3,0,0"):
        with _env("GPUKIT_GEMV_W8_O", cfg):
            check_exact(f"{fmt} o {cfg} M=3", fo(x), xs, deqo)
            check_exact(f"{fmt} o {cfg} M=1", fo(x[:1]), xs[:1], deqo)


@cuda_only
def test_w4_o_gate():
    """GPUKIT_GEMV_W4_O (session 11): (4096, 4096) = 16 Mi weights takes it (a bad value is refused) before
    GPUKIT_GEMV_W4_SMALL; (6144, 4096) does not read it; variant 54 / 62 through it stay within the bound."""
    fo, deqo = make_w4(RNG, "int4_128", 4096, 4096)
    fq, deqq = make_w4(RNG, "int4_128", 6144, 4096)
    x, xs = make_x(RNG, 4096, "bfloat16", m=2)
    with _env("GPUKIT_GEMV_W4_SMALL", "48"), _env("GPUKIT_GEMV_W4_O", "7"):
        with pytest.raises(ValueError, match="GPUKIT_GEMV_W4_O"):
            fo(x, out_dtype="float32")
        check_exact("(6144, 4096): GPUKIT_GEMV_W4_O does not apply", fq(x, out_dtype="float32"), xs, deqq)
    for v in ("54", "62"):
        with _env("GPUKIT_GEMV_W4_O", v):
            check_exact(f"o variant {v} M=2", fo(x, out_dtype="float32"), xs, deqo)
            check_exact(f"o variant {v} M=1", fo(x[:1], out_dtype="float32"), xs[:1], deqo)


def test_w8_stamps_binding_cpu():
    """The staged 8-bit GEMV's stamp switch (session 11, bench/gemv_stamps.py) exists; off is always accepted."""
    gk._C._gemv_w8_stamps(False)
    assert callable(gk._C._gemv_w8_stamps_read)


@cuda_only
def test_w8_stamps_same_bits_and_order():
    """With the per-CTA stamps on, the 8-bit GEMV gives the same bits; each launch takes the next slot with its shape,
    CTAs and warps; every CTA's stamps are set and in order (entry <= copies issued <= wait returned <= first stage
    landed <= loop left <= sums added <= stored), the SM ids are plausible; stamps off, no slot is taken."""
    fn, _ = _w8("fp8", 6144, 4096)
    x, _ = make_x(RNG, 4096, "bfloat16", m=1)
    base = f64(fn(x))
    gk._C._gemv_w8_stamps(True)
    try:
        ys = [fn(x), fn(x)]
    finally:
        gk._C._gemv_w8_stamps(False)
    fn(x)
    for i, y in enumerate(ys):
        same_bits(f"stamped call {i}", f64(y), base)
    meta, raw = gk._C._gemv_w8_stamps_read()
    used = sorted(m for m in meta if m[0] >= 0)
    assert [m[0] for m in used] == [0, 1], used
    seq, n, k, ctas, split, nw = used[0]
    assert (n, k, ctas, split) == (6144, 4096, 384, 1) and 1 <= nw <= 8
    st = np.frombuffer(raw, dtype=np.uint64).reshape(512, 2048, 8)
    for slot in (0, 1):
        s = st[slot, :ctas].astype(np.int64)
        assert (s[:, :7] > 0).all(), "a CTA without stamps"
        for i in range(6):
            assert (s[:, i + 1] >= s[:, i]).all(), f"stamp {i + 1} before stamp {i}"
        assert (s[:, 7] < 1024).all() and len(np.unique(s[:, 7])) > 1
    assert (st[2:] == 0).all(), "a slot past the two stamped launches was written"


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_w8_knob_ws_field(fmt):
    """GPUKIT_GEMV_W8's 11th field WS (session 13): the 8-bit default's cap of 16 warps per SM, so the knob
    "4,2,16,1,3,0,0,0,0,0,16" is the 8-bit default: its bits at the 8B shapes (the q/k/v one is the shape the cap
    changes); with SP 1 (CTA spreading: the same warps and split-K, only where the CTAs land) the same bits too;
    WS out of 0..64 is refused naming the variable."""
    for n, k in ((6144, 4096), (14336, 4096), (4096, 14336), (1001, 4096)):
        fn, deq = _w8(fmt, n, k)
        x, xs = make_x(RNG, k, "bfloat16", m=1)
        base = f64(fn(x))
        check_exact(f"{fmt} ({n}, {k}) default", base, xs, deq)
        for cfg in ("4,2,16,1,3,0,0,0,0,0,16", "4,2,16,1,3,0,1,0,0,0,16"):
            with _env("GPUKIT_GEMV_W8", cfg):
                same_bits(f"{fmt} ({n}, {k}) knob {cfg}", f64(fn(x)), base)
        with _env("GPUKIT_GEMV_W8", "4,2,16,1,3,0,0,0,0,0,65"):
            with pytest.raises(ValueError, match="GPUKIT_GEMV_W8"):
                fn(x)
