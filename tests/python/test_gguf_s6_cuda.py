"""The session-6 kernels of the staged GGUF GEMV (src/cuda/quant_gguf_st.cu, variants 30-36 and
the knob fields UX 0, SP and V of GPUKIT_GEMV_GGUF):

- 30: byte permutes with immediate selectors and the magic bytes in registers (Q8_0 with bf16 x
  also decoded to bf16 by byte operations, as variant 13): the default's operations, so the
  default's bits; 31: 30 with the quad-shared Q4_K / Q6_K scales (variant 22): the same bits.
- 32 / 33: 30 / 31 with Q4_1 and Q4_K's codes entering the mma as 128 + q and the 128 sum(x) taken
  out with the min term (bf16 x only): other bits, against float64 products with the exact
  dequantization within 2 (K + 2) 2^-24 times a bound that counts the larger sums (143 d + |m|
  per Q4_1 block, dmin mn + 271 d sc per Q4_K sub-block); every other format / x dtype the same
  bits as the default.
- 34 / 35: 30 / 33 with the late refill (each ring slot refilled after its decode: one more stage
  in flight while a warp waits): the bits of 30 / 33.
- SP 0 (no CTA spreading: only the shared-memory request changes) and V (the variant's kernel
  through the knob): the same bits as the default / the variant; UX 0 (half the units per stage)
  exact.

"The default" above is variant 29, the session-5 default kernel (the same-bits reference whatever
the shipped default is); test_s6_defaults ties the shipped default to the configuration measured at
checkpoint A. Outputs land in memory poisoned with NaN first (freed just before the call, so the
caching allocator hands it out again). Skipped without a GPU."""
import os

import numpy as np
import pytest

import gpukit as gk
from test_gguf_st_cuda import BLOCK, FMTS, check, f64, make, raw_q8_0, with_variant, xrows, staged_gguf  # noqa: F401 (the autouse fixture)

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")
RNG = np.random.default_rng(606)

SHAPES = [(300, 14336), (37, 4096), (133, 1280), (16, 2304), (70, 6144), (1, 2048), (2051, 1024)]
FOLDED = ("q4_1", "q4_k")


def poison(n_floats):
    junk = gk.full((max(n_floats, 1),), float("nan"), dtype="float32", device="cuda")
    gk.synchronize()
    del junk


def run(fmt, x, qc, variant=0, knob=None):
    fn = getattr(gk, f"gemv_{fmt}")
    if knob:
        os.environ["GPUKIT_GEMV_GGUF"] = knob
    try:
        poison(int(np.prod(x.shape[:-1])) * qc.shape[0] * 2)
        return with_variant(variant, lambda: fn(x, qc, out_dtype="float32"))
    finally:
        os.environ.pop("GPUKIT_GEMV_GGUF", None)


def same_bits(got, ref, what):
    g, r = gk.to_numpy(got), gk.to_numpy(ref)
    if g.tobytes() != r.tobytes():
        i = np.argwhere(g.view(np.uint32) != r.view(np.uint32))
        raise AssertionError(f"{what}: differs from the default at {len(i)} of {g.size} outputs, first "
                             f"{i[0].tolist()}: {g[tuple(i[0])]!r} != {r[tuple(i[0])]!r}")


def fold_bound(fmt, qb, xs):
    """The magnitudes the folded kernel's sums round (see the module docstring)."""
    m = xs.shape[0]
    if fmt == "q4_1":
        b = qb.reshape(qb.shape[0], -1, 20)
        d = np.abs(b[..., 0:2].copy().view(np.float16).astype(np.float64)[..., 0])
        mn = np.abs(b[..., 2:4].copy().view(np.float16).astype(np.float64)[..., 0])
        ax = np.abs(xs).reshape(m, -1, 32).sum(-1)
        return ax @ (143 * d + mn).T
    b = qb.reshape(qb.shape[0], -1, 144)
    d = np.abs(b[..., 0:2].copy().view(np.float16).astype(np.float64)[..., 0])
    dmin = np.abs(b[..., 2:4].copy().view(np.float16).astype(np.float64)[..., 0])
    s12 = b[..., 4:16].astype(np.int64)
    sc = np.concatenate([s12[..., 0:4] & 63, (s12[..., 8:12] & 15) | ((s12[..., 0:4] >> 2) & 48)], -1)
    mn = np.concatenate([s12[..., 4:8] & 63, (s12[..., 8:12] >> 4) | ((s12[..., 4:8] >> 2) & 48)], -1)
    ax = np.abs(xs).reshape(m, -1, 8, 32).sum(-1)
    return np.einsum("mbs,nbs->mn", ax, dmin[..., None] * mn + 271 * d[..., None] * sc)


def check_fold(fmt, got, xs, deq, qb, what):
    ref = xs @ deq.T
    k = xs.shape[1]
    tol = 2 * (k + 2) * 2.0**-24 * fold_bound(fmt, qb, xs) + 1e-30
    g = f64(got)
    assert g.shape == ref.shape, f"{what}: shape {g.shape} != {ref.shape}"
    err = np.abs(g - ref)
    if not np.all(err <= tol):
        i = np.unravel_index(np.argmax(err / tol), err.shape)
        bad = np.argwhere(~(err <= tol))
        raise AssertionError(f"{what}: {len(bad)} of {err.size} out of tolerance; worst y{list(i)} = {g[i]!r}, "
                             f"ref {ref[i]!r}, tol {tol[i]:.3g}, err/tol {err[i] / tol[i]:.3g}; first bad "
                             f"{bad[0].tolist()}")


def raw_blocks(fmt, n, k):
    """Blocks of random bytes (every code, scale and min value) with sane positive fp16 d / m."""
    bw, bb = BLOCK[fmt]
    nb = k // bw
    b = RNG.integers(0, 256, size=(n, nb, bb), dtype=np.uint8)
    d = RNG.uniform(1e-3, 1.0, size=(n, nb, 2)).astype(np.float16)
    if fmt == "q4_1":
        d[..., 1] = -d[..., 1] * 8  # m: the block's minimum, negative as quantize writes it
    b[..., 0:4] = d.view(np.uint8).reshape(n, nb, 4)
    q = gk.asarray(b.reshape(n, nb * bb))
    return q, f64(getattr(gk, f"dequantize_{fmt}")(q)), b.reshape(n, nb * bb)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("variant", [30, 31, 34])
def test_s6_same_bits(fmt, n, k, variant):
    """Variants 30 / 31 / 34 (30 with the late refill): exact, and the default's bits (M = 1 bf16, 6 fp16, 8 bf16): ragged per-warp
    runs, partial last stages, split-K (small N), Q6_K's phased units."""
    if k % BLOCK[fmt][0] or (fmt == "q6_k" and k % 2048):
        pytest.skip("not a shape of the staged kernel")
    q, deq, qb = make(fmt, n, k)
    qc = q.to("cuda")
    for m, dtype in ((1, "bfloat16"), (6, "float16"), (8, "bfloat16")):
        xb, xs = xrows(m, k, dtype)
        x = xb.to("cuda")
        got = run(fmt, x, qc, variant)
        check(fmt, got, xs, deq, qb, f"{fmt} variant {variant} n={n} k={k} M={m} {dtype}")
        same_bits(got, run(fmt, x, qc, 29), f"{fmt} variant {variant} n={n} k={k} M={m} {dtype}")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n,k", [(300, 14336), (37, 4096), (133, 2048), (16, 2304), (1, 2048)])
@pytest.mark.parametrize("variant", [32, 33, 35])
def test_s6_fold(fmt, n, k, variant):
    """Variants 32 / 33 / 35 (33 with the late refill): Q4_1 / Q4_K with bf16 x within the stated
    bound, the same bits every run and for a row alone (35: the bits of 33); fp16 x and the other
    formats: the default's bits."""
    if k % BLOCK[fmt][0] or (fmt == "q6_k" and k % 2048):
        pytest.skip("not a shape of the staged kernel")
    q, deq, qb = make(fmt, n, k)
    qc = q.to("cuda")
    for m, dtype in ((1, "bfloat16"), (8, "bfloat16"), (3, "float16")):
        xb, xs = xrows(m, k, dtype)
        x = xb.to("cuda")
        got = run(fmt, x, qc, variant)
        what = f"{fmt} variant {variant} n={n} k={k} M={m} {dtype}"
        if fmt in FOLDED and dtype == "bfloat16":
            check_fold(fmt, got, xs, deq, qb, what)
            same_bits(got, run(fmt, x, qc, variant), what + " (second run)")
            one = run(fmt, x[m - 1], qc, variant)
            assert gk.to_numpy(one).tobytes() == gk.to_numpy(got)[m - 1].tobytes(), f"{what}: row alone differs"
            if variant == 35:
                same_bits(got, run(fmt, x, qc, 33), what + " against variant 33")
        else:
            check(fmt, got, xs, deq, qb, what)
            same_bits(got, run(fmt, x, qc, 29), what)


@pytest.mark.parametrize("fmt", FOLDED)
@pytest.mark.parametrize("variant", [32, 33, 35])
@pytest.mark.parametrize("n,k", [(300, 4096), (19, 14336)])
def test_s6_fold_raw_blocks(fmt, variant, n, k):
    """Blocks of random bytes (every code and 6-bit scale / min, as a file may hold them) and x with
    outliers: still within the bound."""
    q, deq, qb = raw_blocks(fmt, n, k)
    qc = q.to("cuda")
    xv = RNG.standard_normal((4, k)).astype(np.float32)
    xv[1, ::97] *= 1e4
    xv[2] *= 1e-20
    xb = gk.asarray(xv).astype("bfloat16")
    xs = f64(xb.astype("float32"))
    got = run(fmt, xb.to("cuda"), qc, variant)
    check_fold(fmt, got, xs, deq, qb, f"{fmt} raw blocks variant {variant} n={n} k={k}")


@pytest.mark.parametrize("m", [1, 8])
def test_s6_q8_0_every_code(m):
    """Variant 30 on Q8_0 blocks holding every byte value (-128 included): the default's bits."""
    q, deq, qb = raw_q8_0(300, 4096)
    qc = q.to("cuda")
    xb, xs = xrows(m, 4096, "bfloat16")
    x = xb.to("cuda")
    got = run("q8_0", x, qc, 30)
    check("q8_0", got, xs, deq, qb, f"q8_0 variant 30 every code M={m}")
    same_bits(got, run("q8_0", x, qc, 29), f"q8_0 variant 30 every code M={m}")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("knob,variant", [("2,12,1,1,0,2,0,0", 0), ("2,16,1,1,0,2,0,0", 0), ("2,12,1,1,0,2,0,1,30", 30),
                                          ("2,16,1,1,0,2,0,0,31", 31), ("2,12,1,1,0,2,0,1,33", 33),
                                          ("3,12,1,1,0,2,0,0", 0), ("2,12,0", 0), ("3,12,0", 0), ("2,16,0,1,0,2,0,0", 0),
                                          ("2,12,0,1,0,2,0,1,30", 30), ("2,12,0,1,0,2,0,1,33", 33),
                                          ("2,12,0,1,0,2,0,1,31", 31), ("2,12,1,1,0,2,0,1,34", 34),
                                          ("2,16,1,1,0,2,0,0,35", 35), ("2,12,1,1,0,2,0,2", 0),
                                          ("2,12,1,1,0,2,0,2,33", 33), ("2,12,0,1,0,2,0,1,34", 34),
                                          ("2,12,0,1,0,2,0,1,35", 35)])
def test_s6_knob(fmt, knob, variant):
    """SP 0 (no CTA spreading) / 2 (room for one CTA more per SM), UX 0 (half the units per stage: Q4_0 / Q4_1 / Q4_K) and V (a session-6
    kernel through the knob): exact; with the default plan (D 2, WT 12, UX 1) also the bits of the
    same kernel without the knob (SP changes only the shared-memory request; D 3, WT 16 and UX 0
    change the warps' split of K, so they are compared against the exact products only)."""
    n, k = 211, 6144 if fmt != "q6_k" else 4096
    q, deq, qb = make(fmt, n, k)
    qc = q.to("cuda")
    xb, xs = xrows(5, k, "bfloat16")
    x = xb.to("cuda")
    got = run(fmt, x, qc, 0, knob)
    what = f"{fmt} knob {knob}"
    if fmt in FOLDED and variant in (32, 33, 35):
        check_fold(fmt, got, xs, deq, qb, what)
    else:
        check(fmt, got, xs, deq, qb, what)
    fields = knob.split(",")
    ux = fields[2] if len(fields) > 2 else "1"
    if fields[0] == "2" and fields[1] == "12" and (ux == "1" or fmt in ("q8_0", "q6_k")):  # the default plan
        same_bits(got, run(fmt, x, qc, variant or 29), what)
    if ux == "0" and variant in (30, 31) and fmt in ("q4_0", "q4_1", "q4_k"):  # the plain UX 0 kernel's bits
        same_bits(got, run(fmt, x, qc, 0, knob.rsplit(",", 1)[0]), what + " against V 0")
    if ux == "0" and variant in (34, 35):  # the late refill with half units: the bits of 30 / 33 with them
        ref = knob.rsplit(",", 1)[0] + (",30" if variant == 34 else ",33")
        same_bits(got, run(fmt, x, qc, 0, ref), what + f" against {ref}")


@pytest.mark.parametrize("knob", ["2,12,1,1,0,2,0,3", "2,12,1,1,0,2,0,1,29",
                                  "3,12,1,1,0,2,0,1,30", "2,12,2,1,0,2,0,1,30", "2,12,1,1,0,3,0,1,30",
                                  "2,12,1,1,0,2,1,1,30", "3,12,0,1,0,2,0,1,30", "2,12,0,1,0,3", "4,12,0",
                                  "2,12,0,1,0,2,1", "2,12,-1", "3,12,0,1,0,2,0,1,34", "2,12,1,1,0,2,0,1,49", "3,12,1,1,0,2,0,1,41", "3,12,0,1,0,2,0,1,43",
                                  "3,12,1,1,0,2,0,1,47", "3,12,0,1,0,2,0,1,48", "2,12,1,1,0,2,0,1,39", "2,12,0,1,0,2,0,1,40", "2,12,1,1,0,2,0,1,40",
                                  "3,12,1,1,0,2,0,1,7", "2,12,0,1,0,2,0,1,36", "2,12,1,1,0,2,0,1,8",
                                  "3,12,1,1,0,2,0,1,37", "2,12,0,1,0,2,0,1,38",
                                  "3,12,1,1,0,2,0,1,39", "3,12,0,1,0,2,0,1,39"])
def test_s6_knob_rejects(knob):
    q, _, _ = make("q4_0", 16, 256)
    x = gk.asarray(np.ones((1, 256), np.float32)).astype("bfloat16").to("cuda")
    os.environ["GPUKIT_GEMV_GGUF"] = knob
    try:
        with pytest.raises(ValueError, match="GPUKIT_GEMV_GGUF"):
            gk.gemv_q4_0(x, q.to("cuda"))
    finally:
        del os.environ["GPUKIT_GEMV_GGUF"]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("knob", ["2,12,1,1,0,2,0,0,7", "2,12,1,1,0,2,0,2,36", "2,16,1,1,0,2,0,1,36"])
def test_s6_knob_copies_alone_run(fmt, knob):
    """V 7 / 36 (the copies alone, benchmarking only: wrong results): they run on every format and
    shape class (ragged, split-K) without a fault, and the next normal call is exact again."""
    for n, k in ((300, 4096), (19, 14336), (16, 2048)):
        if fmt == "q6_k" and k % 2048:
            continue
        q, deq, qb = make(fmt, n, k)
        qc = q.to("cuda")
        xb, xs = xrows(2, k, "bfloat16")
        x = xb.to("cuda")
        got = run(fmt, x, qc, 0, knob)
        assert got.shape == (2, n)
        gk.synchronize()
        check(fmt, run(fmt, x, qc), xs, deq, qb, f"{fmt} after knob {knob} n={n} k={k}")


# The shipped configuration (gcfg_default) and the measured configuration it was taken from:
# (format, few row tiles) -> (variant, knob); few: N <= 132 * 8 * 16 rows.
DEFAULT_OF = {("q8_0", True): (34, None), ("q8_0", False): (34, None),
              ("q4_0", True): (0, "2,12,0,1,0,2,0,1,30"), ("q4_0", False): (30, None),
              ("q4_1", True): (0, "2,12,0,1,0,2,0,1,32"), ("q4_1", False): (35, None),
              ("q4_k", True): (0, "2,12,0,1,0,2,0,1,33"), ("q4_k", False): (0, "2,12,0,1,0,2,0,1,33"),
              ("q6_k", True): (31, None), ("q6_k", False): (31, None)}


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("few", [True, False])
def test_s6_defaults(fmt, few):
    """The default is the configuration measured at checkpoint A (the same bits as that variant /
    knob) and exact; N = 17000 rows (more than 132 * 8 row tiles: the lm-head rule) and N = 300."""
    n = 300 if few else 17000
    k = 2048 if fmt == "q6_k" else (4096 if few else 256)
    q, deq, qb = make(fmt, n, k)
    qc = q.to("cuda")
    variant, knob = DEFAULT_OF[(fmt, few)]
    for m, dtype in ((1, "bfloat16"), (3, "float16"), (8, "bfloat16")):
        xb, xs = xrows(m, k, dtype)
        x = xb.to("cuda")
        got = run(fmt, x, qc)
        what = f"{fmt} default n={n} k={k} M={m} {dtype}"
        if fmt in FOLDED and dtype == "bfloat16":
            check_fold(fmt, got, xs, deq, qb, what)
        else:
            check(fmt, got, xs, deq, qb, what)
        same_bits(got, run(fmt, x, qc, variant, knob), what + f" against variant {variant} knob {knob}")
