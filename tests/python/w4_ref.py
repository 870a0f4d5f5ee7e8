"""Helpers shared by the staged 4-bit GEMV tests (test_gemv_w4_*_cuda.py): weights and x of a test's own random
generator (each module passes its RNG, so every module draws the same data as before the helpers moved here), the
gemv closures with the float64 of the exact dequantization, the variant switch, the float64 bound of the k_w4 kernels
2 (K + 2) 2^-24 sum |x| |w|, the fixed-point emulation and bound of k_w4i (variants 63-66, the int4 g128 / bf16 x
default since session 15), the default's bound and the checks with diagnostics (worst element, first bad index, counts)."""
import math

import numpy as np

import gpukit as gk


def f64(a):
    return np.asarray(gk.to_numpy(a) if isinstance(a, gk.Array) else a).astype(np.float64)


def w4_weights(rng, n, k):
    """float32 weights (n, k) ~ N(0, 1 / k), the first 64 columns 8x larger (scales differ between groups)."""
    w = (rng.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
    w[:, : min(k, 64)] *= 8.0
    return w


def mma_order(q):
    """Codes (rows of K / 2 bytes, weight 2j in byte j's low nibble, 2j + 1 in its high nibble)
    reordered so that each 32-bit little-endian word's nibble p holds weight 2p and nibble p + 4
    weight 2p + 1: bytes (w0 | w2 << 4, w4 | w6 << 4, w1 | w3 << 4, w5 | w7 << 4)."""
    q = np.ascontiguousarray(q, dtype=np.uint8)
    assert q.shape[-1] % 4 == 0
    b = q.reshape(q.shape[:-1] + (q.shape[-1] // 4, 4))
    w = np.empty(b.shape[:-1] + (8,), dtype=np.uint8)
    w[..., 0::2], w[..., 1::2] = b & 0xF, b >> 4
    out = np.empty_like(b)
    out[..., 0] = w[..., 0] | (w[..., 2] << 4)
    out[..., 1] = w[..., 4] | (w[..., 6] << 4)
    out[..., 2] = w[..., 1] | (w[..., 3] << 4)
    out[..., 3] = w[..., 5] | (w[..., 7] << 4)
    return out.reshape(q.shape)


def make_w4(rng, fmt, n, k, order=False, row_mag=None):
    """(gemv on CUDA, float64 of the dequantized weights) for fmt "int4_G..." (group G) or "nvf4..."; order: the
    int4 codes in the mma nibble order (mma_order); row_mag: per-row magnitudes (rows of very different size)."""
    w = w4_weights(rng, n, k)
    if row_mag is not None:
        w *= row_mag[:, None].astype(np.float32)
    if fmt.startswith("nvf4"):
        q, bs, ts = gk.quantize_nvf4(gk.asarray(w))
        qc, bc, tc = q.to("cuda"), bs.to("cuda"), ts.to("cuda")
        return (lambda x, **kw: gk.gemv_nvf4(x, qc, bc, tc, **kw)), f64(gk.dequantize_nvf4(q, bs, ts))
    g = int(fmt.split("_")[1])
    q, s, z = gk.quantize_int4(gk.asarray(w), group=g)
    deq = f64(gk.dequantize_int4(q, s, z, group=g))
    if order:
        q = gk.asarray(mma_order(gk.to_numpy(q)))
    qc, sc, zc = q.to("cuda"), s.to("cuda"), z.to("cuda")
    return (lambda x, **kw: gk.gemv_int4(x, qc, sc, zc, group=g, **kw)), deq


def bf16_x(xf, xdt="bfloat16"):
    """(x of dtype xdt on CUDA, its float64 values) from float values xf."""
    xh = gk.asarray(np.asarray(xf, dtype=np.float32)).astype(xdt)
    return xh.to("cuda"), f64(xh.astype("float32"))


def x_dtype(fmt):
    """x's dtype for a format name: "..._f16" float16, else bfloat16."""
    return "float16" if fmt.endswith("_f16") else "bfloat16"


def make_x(rng, k, xdt, m=8):
    """(x (m, k) of dtype xdt on CUDA, its float64 values)."""
    xh = gk.asarray(rng.standard_normal((m, k)).astype(np.float32)).astype(xdt)
    return xh.to("cuda"), f64(xh.astype("float32"))


def call(fn, x, variant=0, **kw):
    """fn(x, **kw) under GEMV variant `variant` (the switch back to 0 afterwards, also on errors)."""
    gk._C._gemv_set_variant(variant)
    try:
        return fn(x, **kw)
    finally:
        gk._C._gemv_set_variant(0)


def call_f32(fn, x, variant, **kw):
    """call() with float32 output, as float64."""
    gk._C._gemv_set_variant(variant)
    try:
        return f64(fn(x, out_dtype="float32", **kw))
    finally:
        gk._C._gemv_set_variant(0)


def bound_f32(xs, deq, k=None):
    """The default's float64 bound per (m, n): 2 (K + 2) 2^-24 sum_k |x| |w| (K: xs.shape[1] unless given)."""
    k = xs.shape[1] if k is None else k
    return 2 * (k + 2) * 2.0**-24 * (np.abs(xs) @ np.abs(deq).T) + 1e-30


def within(tag, got, ref, tol):
    """|got - ref| <= tol everywhere (got: an array or a gk.Array), else an error naming the worst element."""
    got = f64(got)
    err = np.abs(got - ref)
    if not np.all(err <= tol):
        i = np.unravel_index(np.argmax(err / tol), err.shape)
        bad = np.argwhere(~(err <= tol))
        raise AssertionError(f"{tag}: {len(bad)} of {err.size} out of the bound; worst y{list(i)} = {got[i]!r}, "
                             f"ref {ref[i]!r}, err {err[i]:.3g}, bound {tol[i]:.3g}; first bad {bad[0].tolist()}; "
                             f"max err / bound {np.max(err / tol):.3g}; non-finite {int(np.sum(~np.isfinite(got)))}")


def fixed_point(xs):
    """(x as the kernel represents it, its per-element step 2^(c_b - 141)) for float64 x (m, k) holding bf16 values."""
    m, k = xs.shape
    xb = xs.reshape(m, k // 128, 128)
    mx = np.max(np.abs(xb), axis=2)
    with np.errstate(divide="ignore"):
        _, ex = np.frexp(mx)  # mx = f 2^ex, f in [0.5, 1): biased exponent ex + 126 (0 for 0 and subnormals)
    e = np.where(mx > 0, ex + 126, 0)
    e = np.where(mx >= 2.0**-126, e, 0)
    c = np.clip(e, 15, 254).astype(np.float64)
    step = np.exp2(c - 141)[..., None]
    xq = np.rint(xb / step) * step
    return xq.reshape(m, k), np.broadcast_to(step, xb.shape).reshape(m, k)


def emu_bound(xs, deq, xq=None):
    """2 (K / 128 + 40) 2^-24 sum_k (|x_k| + |x_k as fixed point|) |w_k| (xq: fixed_point(xs)[0] if already known)"""
    k = xs.shape[1]
    if xq is None:
        xq, _ = fixed_point(xs)
    return 2 * (k / 128 + 40) * 2.0**-24 * ((np.abs(xs) + np.abs(xq)) @ np.abs(deq).T) + 1e-30


def check_v(tag, got, xs, deq):
    xq, step = fixed_point(xs)
    tol = emu_bound(xs, deq, xq)
    within(f"{tag} vs the emulation", got, xq @ deq.T, tol)
    within(f"{tag} vs float64", got, xs @ deq.T, tol + 0.5 * (step @ np.abs(deq).T))


def check_exact(tag, got, xs, deq, k=None):
    """got within the default's bound (bound_f32) of x @ w^T in float64."""
    within(tag, got, xs @ deq.T, bound_f32(xs, deq, k))


# The int4 g128 / bf16 x default (kG128Wide / kG128Mid in src/cuda/gemv_w4_staged.cu): variant 66's configuration since
# session 15 (k_w4i, x as 16-bit fixed point per 128-element block, where K % 512 == 0 and M <= 8; elsewhere 48's
# kernels); 48 before.
DEFAULT_G128 = 66


def default_is_imma(fmt, k, m=1, xdt="bfloat16"):
    """Whether the default runs k_w4i (the integer tensor cores): int4 g128 with bf16 x, K % 512 == 0, 1 <= M <= 8."""
    return fmt == "int4_128" and xdt == "bfloat16" and k % 512 == 0 and 1 <= m <= 8


def default_tol(xs, deq, imma):
    """The default's float64 bound per (m, n): bound_f32, or where it runs k_w4i (imma) the emulation bound plus the
    fixed point's own error, 0.5 sum_k step_k |w_k| (check_v's second bound)."""
    if not imma:
        return bound_f32(xs, deq)
    xq, step = fixed_point(xs)
    return emu_bound(xs, deq, xq) + 0.5 * (step @ np.abs(deq).T)


def check_default(tag, got, xs, deq, imma):
    """got within the default's bound: check_v (both of its bounds) where it runs k_w4i, else check_exact."""
    if imma:
        check_v(tag, got, xs, deq)
    else:
        check_exact(tag, got, xs, deq)


def same_bits(tag, a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.tobytes() != b.tobytes():
        bad = np.argwhere(a != b)
        raise AssertionError(f"{tag}: {len(bad)} of {a.size} differ; first {bad[0].tolist()}: "
                             f"{a[tuple(bad[0])]!r} vs {b[tuple(bad[0])]!r}; max |diff| {np.nanmax(np.abs(a - b)):.3g}")


def rows_match(tag, fn, variant, x, check):
    """M = 8 checked (check(tag, y)); rows 0 / 3 / 7 alone, M = 2 / 5 and a second call (1-d x) give its bits.
    Returns M = 8's result (float64)."""
    full = f64(call(fn, x, variant, out_dtype="float32"))
    check(f"{tag} M=8", full)
    for r in (0, 3, 7):
        same_bits(f"{tag}: row {r} at M=1 vs M=8", f64(call(fn, x[r:r + 1], variant, out_dtype="float32")),
                  full[r:r + 1])
    for m in (2, 5):
        same_bits(f"{tag}: M={m} vs M=8", f64(call(fn, x[:m], variant, out_dtype="float32")), full[:m])
    same_bits(f"{tag}: row 3 (1-d x) second call", f64(call(fn, x[3], variant, out_dtype="float32")), full[3])
    return full


def poisoned_calls(fn, x, variant, n, check, runs=2):
    """call_f32(fn, x, variant) `runs` times, each right after a NaN-filled float32 allocation of n outputs was freed
    (the caching allocator hands that memory to the output, so a row the kernel does not write reads NaN): every
    output finite, then check(got). Returns the last result."""
    for _ in range(runs):
        poison = gk.asarray(np.full((1, n), np.nan, np.float32)).to("cuda")
        gk.cuda.synchronize()
        del poison
        got = call_f32(fn, x, variant)
        assert np.all(np.isfinite(got)), f"{int(np.sum(~np.isfinite(got)))} outputs not written (NaN poison)"
        check(got)
    return got


def bf16_out_is_rounded(tag, fn, x, variant, got):
    """fn(x) with its default (bf16) output under `variant` gives `got` (its float32 output, as float64) rounded to
    bf16, bit for bit."""
    gk._C._gemv_set_variant(variant)
    try:
        yb = f64(fn(x).astype("float32"))
    finally:
        gk._C._gemv_set_variant(0)
    same_bits(tag, yb, f64(gk.asarray(got.astype(np.float32)).astype("bfloat16").astype("float32")))


def graph_replays_same_bits(tag, fn, x, variant, ref, replays=2):
    """Two calls fn(x, float32 out) captured in a CUDA graph under the process variant `variant` (read at capture), the
    graph replayed `replays` times: every output is `ref` bit for bit."""
    gk._C._gemv_set_variant(variant)
    try:
        g = gk.Graph()
        with g:
            outs = [fn(x, out_dtype="float32"), fn(x, out_dtype="float32")]
    finally:
        gk._C._gemv_set_variant(0)
    for _ in range(replays):
        g.replay()
        gk.cuda.synchronize()
        for o in outs:
            same_bits(tag, f64(o), ref)
