"""The staged 4-bit GEMV's session-6 configurations (src/cuda/gemv_w4_staged.cu, common/gemv_w4.cuh).

x through the ring (k_w4's MODE 8; M = 1 only, M > 1 runs MODE 0 with the same plan): each
stage's x is copied with its codes and read from shared memory, the same arithmetic as MODE 0,
so M = 1 must give the bits of the same row at M = 2..8, and the default's float64 bound
2 (K + 2) 2^-24 sum |x| |w|. Variant 17: a ring of 3; 19: a ring of 2 (the default since
session 6: variant 0 runs it too); 20: MODE 0 with a ring of 2 at every M (its own plan); 27: 19
with the loop over the ring's stages not unrolled (the default's bits). int4
g32 / g64 / g128 and NVF4 (K = 4864: NVF4's partial last stage, with the x copy of its 2 valid
blocks; 1152: narrow copies, MODE 0 with a ring of 3 runs at every M), split-K (N = 37, long K),
odd N, the same bits on a second call, x as a view. Skipped without a GPU.

(Session 6's int4 "zero-point mma", variants 15 / 18, was removed after checkpoint A: slower at
every shape; docs/notes/gemv4-s6.md.)"""
import numpy as np
import pytest

import gpukit as gk
from w4_ref import call, check_default, check_exact, default_is_imma, f64, make_w4

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")
RNG = np.random.default_rng(606)
VXS, VX2, VD2, VROLL = 17, 19, 20, 27


def make_any(fmt, n, k):
    return make_w4(RNG, fmt, n, k)


@pytest.mark.parametrize("fmt", ["int4_32", "int4_64", "int4_128", "nvf4"])
@pytest.mark.parametrize("variant", [VXS, VX2, VD2])
@pytest.mark.parametrize("n,k", [(37, 4096), (300, 14336), (2051, 1536), (37, 32768), (133, 4608),
                                 (300, 4864), (133, 1152)])
def test_ring_configs_rows_match(fmt, variant, n, k):
    """M = 1 = the same row at M = 2..8, bit for bit, within the default's bound (17 / 19: x
    through the ring at M = 1, x from global memory at M > 1 with the same plan; 20: one kernel)."""
    fn, deq = make_any(fmt, n, k)
    xb = gk.asarray(RNG.standard_normal((8, k)).astype(np.float32)).astype("bfloat16")
    x = xb.to("cuda")
    xs = f64(xb.astype("float32"))
    full = f64(call(fn, x, variant, out_dtype="float32"))
    check_exact(f"{fmt} variant {variant} n={n} k={k} M=8", full, xs, deq)
    for r in (0, 3, 7):
        one = f64(call(fn, x[r:r + 1], variant, out_dtype="float32"))
        if one.tobytes() != full[r:r + 1].tobytes():
            bad = np.argwhere(one != full[r:r + 1])
            raise AssertionError(f"{fmt} variant {variant} n={n} k={k}: row {r} at M=1 differs from M=8 in "
                                 f"{len(bad)} of {one.size}; first {bad[0].tolist()}: {one[tuple(bad[0])]!r} vs "
                                 f"{full[r:r + 1][tuple(bad[0])]!r}")
    again = f64(call(fn, x[3], variant, out_dtype="float32"))
    assert again.tobytes() == full[3].tobytes(), "row 3 alone (1-d x) differs on a second call"
    for m in (2, 5):
        assert f64(call(fn, x[:m], variant, out_dtype="float32")).tobytes() == full[:m].tobytes(), f"M={m} rows differ"


@pytest.mark.parametrize("fmt", ["int4_32", "int4_64", "int4_128", "nvf4"])
@pytest.mark.parametrize("n,k", [(300, 4096), (37, 32768), (300, 4864)])
def test_default_is_x_through_a_ring_of_2(fmt, n, k):
    """Variant 19 (x through a ring of 2) is the default configuration, and 27 (the same with the
    stage loop rolled) does the same arithmetic: the same bits at M = 1, 3 and 8 (K = 32768:
    split-K and many stages per warp; 4864: NVF4's partial last stage). int4 g128 with K % 512 == 0 runs k_w4i by
    default since session 15 (its own bound; 19 and 27 within the float64 bound)."""
    fn, deq = make_any(fmt, n, k)
    xh = gk.asarray(RNG.standard_normal((8, k)).astype(np.float32)).astype("bfloat16")
    xs = f64(xh.astype("float32"))
    xb = xh.to("cuda")
    imma = default_is_imma(fmt, k)  # int4 g128 (K % 512 == 0): the default is k_w4i since session 15, not 19's bits
    for m in (1, 3, 8):
        a = f64(call(fn, xb[:m], 0, out_dtype="float32"))
        check_default(f"{fmt} n={n} k={k} default M={m}", a, xs[:m], deq, imma)
        for v in (VX2, VROLL):
            if imma:
                check_exact(f"{fmt} n={n} k={k} variant {v} M={m}", f64(call(fn, xb[:m], v, out_dtype="float32")),
                            xs[:m], deq)
                continue
            b = f64(call(fn, xb[:m], v, out_dtype="float32"))
            if a.tobytes() != b.tobytes():
                bad = np.argwhere(a != b)
                raise AssertionError(f"{fmt} n={n} k={k} M={m}: variant {v} differs from the default in {len(bad)} "
                                     f"of {a.size}; first {bad[0].tolist()}: {b[tuple(bad[0])]!r} vs "
                                     f"{a[tuple(bad[0])]!r}")


@pytest.mark.parametrize("fmt", ["int4_128", "nvf4"])
def test_x_through_ring_x_view(fmt):
    """x as a view into a wider 2-d array, not its first row (the front end makes x contiguous
    and 16-byte aligned): the copies read the right row."""
    n, k = 300, 4096
    fn, deq = make_any(fmt, n, k)
    bigh = gk.asarray(RNG.standard_normal((3, k + 64)).astype(np.float32)).astype("bfloat16")
    xs = f64(bigh.astype("float32"))[1:2, :k]
    xv = bigh.to("cuda")[1:2, :k]
    for v in (VX2, 0):
        got = f64(call(fn, xv, v, out_dtype="float32"))
        check_default(f"{fmt} x view, variant {v}", got, xs, deq, v == 0 and default_is_imma(fmt, k))
