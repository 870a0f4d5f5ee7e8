"""The staged 4-bit GEMV's session-7 variants (src/cuda/gemv_w4_staged.cu, common/gemv_w4.cuh); int4 g128, bf16 x.

37: the per-shape plan (variant 20's configuration, MODE 0 with a ring of 2 and its own plan, where
N >= 2 K; the default elsewhere; a function of (N, K) only): a row's bits must not depend on M,
and must be variant 20's bits where N >= 2 K and the session-6 default's (19's) elsewhere.
38: the default on codes in the "mma nibble order" (k_w4's ORD: in each 32-bit word of 8 codes,
nibble p holds weight 2p and nibble p + 4 weight 2p + 1, p = 0..3; x then needs no byte permutes);
39: 37 with the mma nibble order. The codes are reordered here in NumPy (mma_order) and the result
is checked against float64 on the natural-order dequantization; the natural-order codes under
38 must give a different result (the flag is in effect). Other formats run the default under
37-39 (checked: the default's bits). The GPU tests skip without a GPU; the reorder's own test
runs everywhere."""
import numpy as np
import pytest

import gpukit as gk
from w4_ref import call, check_exact, f64, make_w4, mma_order, same_bits
from w4_ref import rows_match as rows_match_check

cuda = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")
RNG = np.random.default_rng(707)
VSHAPE, VORD, VBOTH, VD2, VX2 = 37, 38, 39, 20, 19


def test_mma_order_nibbles():
    """The reorder: word nibble p = weight 2p, p + 4 = weight 2p + 1 (runs without a GPU)."""
    codes = RNG.integers(0, 16, size=(3, 64), dtype=np.uint8)  # weights of 3 rows
    q = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    words = mma_order(q).view("<u4")
    for r in range(3):
        for wi in range(words.shape[1]):
            u = int(words[r, wi])
            for p in range(4):
                assert (u >> (4 * p)) & 0xF == codes[r, 8 * wi + 2 * p]
                assert (u >> (4 * (p + 4))) & 0xF == codes[r, 8 * wi + 2 * p + 1]


def make(fmt, n, k, order=False):
    """(gemv on CUDA, float64 dequantization); order: the int4 codes in the mma nibble order."""
    return make_w4(RNG, fmt, n, k, order=order)


def rows_match(tag, fn, variant, x, xs, deq):
    """M = 8 within the bound; rows 0 / 3 / 7 alone and M = 2 / 5 give the same bits. Returns M = 8's."""
    return rows_match_check(tag, fn, variant, x, lambda t, y: check_exact(t, y, xs, deq))


# N >= 2 K (variant 20's configuration under 37): (2051, 1024), (9000, 4096), (1000, 384: narrow
# rows of scales, the narrow kernel either way), (4099, 1536); N < 2 K: (37, 4096), (300, 14336),
# (37, 32768: split-K), (300, 4864: a partial last stage), (133, 1152: narrow)
SHAPES = [(2051, 1024), (9000, 4096), (1000, 384), (4099, 1536), (37, 4096), (300, 14336), (37, 32768),
          (300, 4864), (133, 1152)]


@cuda
@pytest.mark.parametrize("n,k", SHAPES)
def test_shape_plan_rows_match(n, k):
    """37 (int4 g128): a row's bits independent of M, within the float64 bound, and variant 20's bits
    where N >= 2 K (K % 512 == 0), variant 19's (the session-6 default's) where N < 2 K, the default's (the narrow
    kernel) where K % 512 != 0, at M = 1 and M = 8."""
    fn, deq = make("int4_128", n, k)
    xb = gk.asarray(RNG.standard_normal((8, k)).astype(np.float32)).astype("bfloat16")
    x, xs = xb.to("cuda"), f64(xb.astype("float32"))
    full = rows_match(f"int4_128 variant 37 n={n} k={k}", fn, VSHAPE, x, xs, deq)
    # N < 2 K: the session-6 default's configuration (variant 19's bits; the default itself runs k_w4i where
    # K % 512 == 0 since session 15), the narrow kernel (the default's) where K % 512 != 0
    other = VD2 if n >= 2 * k and k % 512 == 0 else (VX2 if k % 512 == 0 else 0)
    same_bits(f"n={n} k={k} M=8: 37 vs {other}", full, f64(call(fn, x, other, out_dtype="float32")))
    same_bits(f"n={n} k={k} M=1: 37 vs {other}", f64(call(fn, x[2:3], VSHAPE, out_dtype="float32")),
              f64(call(fn, x[2:3], other, out_dtype="float32")))


@cuda
@pytest.mark.parametrize("variant", [VORD, VBOTH])
@pytest.mark.parametrize("n,k", SHAPES)
def test_mma_order_rows_match(variant, n, k):
    """38 / 39 on codes in the mma nibble order: within the float64 bound of the natural-order
    dequantization, a row's bits independent of M; the natural-order codes give other results."""
    fn, deq = make("int4_128", n, k, order=True)
    xb = gk.asarray(RNG.standard_normal((8, k)).astype(np.float32)).astype("bfloat16")
    x, xs = xb.to("cuda"), f64(xb.astype("float32"))
    rows_match(f"int4_128 variant {variant} (mma order) n={n} k={k}", fn, variant, x, xs, deq)
    if variant == VORD:  # the flag is in effect: the natural order under 38 is not the product
        fn2, deq2 = make("int4_128", n, k)
        got = f64(call(fn2, x, VORD, out_dtype="float32"))
        assert np.max(np.abs(got - xs @ deq2.T)) > 1e-3 * np.max(np.abs(xs @ deq2.T)), \
            "variant 38 on natural-order codes matches the product: the nibble order is not in effect"


@cuda
@pytest.mark.parametrize("fmt", ["int4_32", "int4_64", "nvf4"])
@pytest.mark.parametrize("variant", [VSHAPE, VORD, VBOTH])
def test_other_formats_run_the_default(fmt, variant):
    """37-39 change int4 g128 only: other formats give the default's bits (natural order)."""
    n, k = 2051, 1024
    fn, deq = make(fmt, n, k)
    xb = gk.asarray(RNG.standard_normal((8, k)).astype(np.float32)).astype("bfloat16")
    x, xs = xb.to("cuda"), f64(xb.astype("float32"))
    for m in (1, 8):
        a = f64(call(fn, x[:m], 0, out_dtype="float32"))
        check_exact(f"{fmt} default M={m}", a, xs[:m], deq)
        same_bits(f"{fmt} M={m}: variant {variant} vs the default", f64(call(fn, x[:m], variant, out_dtype="float32")), a)
