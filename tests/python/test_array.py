"""gpukit.Array: views, factories, dtypes and conversions, repr, indexing, setitem,
type promotion, and the error paths of bad input."""
import math

import numpy as np
import pytest

import gpukit as gk
import harness
from conftest import HAS_CUDA, needs_cuda

try:
    import ml_dtypes
except ImportError:  # the GPU machine may lack it
    ml_dtypes = None
needs_ml_dtypes = pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes is not installed")

DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]
ALL_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float8_e4m3fn", "float8_e5m2",
              "float16", "bfloat16", "float32", "float64"]


def np_of(x):
    return harness.values(x)


# ---------------------------------------------------------------- views

@pytest.mark.parametrize("device", DEVICES)
def test_views_share_storage_and_match_numpy(device):
    ref = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4)
    a = gk.asarray(ref.astype(np.float32), device=device)
    views = {
        "reshape": (a.reshape(6, 4), ref.reshape(6, 4)),
        "reshape_-1": (a.reshape(-1), ref.reshape(-1)),
        "transpose": (a.transpose(0, 2), ref.transpose(2, 1, 0)),
        "permute": (a.permute(2, 0, 1), ref.transpose(2, 0, 1)),
        "T": (a.T, ref.T),
        "slice_step": (a[:, ::2, 1::2], ref[:, ::2, 1::2]),
        "negative_step": (a[::-1, :, ::-3], ref[::-1, :, ::-3]),
        "narrow": (a.narrow(2, 1, 2), ref[:, :, 1:3]),
        "select": (a.select(1, -1), ref[:, -1]),
        "unsqueeze": (a.unsqueeze(1), ref[:, None]),
        "squeeze": (a[:, :1].squeeze(1), ref[:, 0]),
        "squeeze_all": (a[:1, :1].squeeze(), ref[0, 0]),
        "broadcast_to": (a[:, :1].broadcast_to((5, 2, 3, 4)), np.broadcast_to(ref[:, :1], (5, 2, 3, 4))),
        "none_ellipsis": (a[None, ..., 2], ref[None, ..., 2]),
    }
    for name, (v, r) in views.items():
        assert v.shares_memory(a), name
        assert v.shape == r.shape, name
        np.testing.assert_array_equal(np_of(v), r, err_msg=name)
    assert a.T.strides == (1, 4, 12)
    assert a[:, ::2].strides == (12, 8, 1)
    assert a[1].offset == 12


def test_reshape_of_non_contiguous_view_needs_copy():
    a = gk.arange(12, dtype=gk.float32).reshape(3, 4)
    with pytest.raises(ValueError, match="contiguous"):
        a.T.reshape(12)
    c = a.T.contiguous()
    assert c.is_contiguous() and not c.shares_memory(a)
    np.testing.assert_array_equal(np_of(c.reshape(12)), np.arange(12).reshape(3, 4).T.reshape(12))
    # a view that merges compatible dims works without copying
    assert a[:, :2].reshape(3, 2).shares_memory(a)
    assert a[::2].reshape(2, 2, 2).shares_memory(a)


def test_view_writes_are_visible_through_the_base():
    a = gk.zeros((4, 5), dtype=gk.int32)
    a.T[1:3, ::2] = 7
    want = np.zeros((4, 5))
    want.T[1:3, ::2] = 7
    np.testing.assert_array_equal(np_of(a), want)


def test_as_strided_and_view_dtype():
    a = gk.arange(6, dtype=gk.float32)
    w = a.as_strided((2, 2), (1, 2), 1)
    np.testing.assert_array_equal(np_of(w), [[1, 3], [2, 4]])
    v = gk.asarray(np.array([1.0], np.float32)).view_dtype("int32")
    assert v.numpy()[0] == 0x3F800000
    assert gk.zeros((2, 4), dtype="float32").view_dtype("uint8").shape == (2, 16)


# ---------------------------------------------------------------- factories

@pytest.mark.parametrize("device", DEVICES)
def test_factories(device):
    z = gk.zeros((2, 3), device=device)
    assert z.dtype == gk.float32 and z.shape == (2, 3) and str(z.device).startswith(device)
    np.testing.assert_array_equal(np_of(z), np.zeros((2, 3)))
    np.testing.assert_array_equal(np_of(gk.ones(4, dtype=gk.int8, device=device)), np.ones(4))
    np.testing.assert_array_equal(np_of(gk.full((3,), 2.5, dtype="bfloat16", device=device)), [2.5] * 3)
    assert gk.full((2,), True, device=device).dtype == gk.bool_
    assert gk.full((2,), 7, device=device).dtype == gk.int64
    assert gk.empty((0, 4), device=device).shape == (0, 4)
    assert gk.arange(5, device=device).dtype == gk.int64
    assert gk.arange(0.0, 1.0, 0.25, device=device).dtype == gk.float32
    np.testing.assert_array_equal(np_of(gk.arange(2, 11, 3, device=device)), [2, 5, 8])
    np.testing.assert_allclose(np_of(gk.arange(1.0, 0.0, -0.25, device=device)), [1.0, 0.75, 0.5, 0.25])
    assert gk.arange(3, 3, device=device).shape == (0,)
    x = gk.zeros((2, 3), dtype="int16", device=device)
    assert gk.ones_like(x).dtype == gk.int16 and gk.full_like(x, 4).shape == (2, 3)
    assert gk.empty_like(x).device == x.device


def test_array_asarray_from_numpy():
    n = np.arange(6, dtype=np.int32).reshape(2, 3)
    v = gk.from_numpy(n)
    assert v.dtype == gk.int32 and v.shape == (2, 3)
    n[0, 0] = 42  # zero copy
    assert v.numpy()[0, 0] == 42
    c = gk.array(n)
    n[0, 1] = 43
    assert c.numpy()[0, 1] == 1  # gk.array copies
    assert gk.asarray(n[:, ::2]).strides == (3, 2)
    assert gk.asarray(n[::-1]).numpy().tolist() == n[::-1].tolist()
    assert gk.asarray([1.5, 2]).dtype == gk.float32       # Python floats -> float32
    assert gk.asarray([1, 2]).dtype == gk.int64
    assert gk.asarray(True).dtype == gk.bool_
    assert gk.asarray(np.float64(1.5)).dtype == gk.float64
    assert gk.asarray([[1, 2]], dtype="float16").dtype == gk.float16
    assert np.asarray(gk.arange(3)).tolist() == [0, 1, 2]  # __array__
    assert gk.asarray(3.0).shape == ()


# ---------------------------------------------------------------- dtypes and conversions

def test_dtype_names_and_itemsize():
    for name in ALL_DTYPES:
        t = getattr(gk, name if name != "bool" else "bool_")
        assert gk._C.dtype_name(t) == name
        assert gk.zeros(3, dtype=name).dtype == t
    assert gk.float32.itemsize == 4 and gk.bfloat16.itemsize == 2 and gk.float8_e5m2.itemsize == 1
    for alias, name in [("f32", "float32"), ("bf16", "bfloat16"), ("half", "float16"), ("fp8_e4m3", "float8_e4m3fn"),
                        (np.float16, "float16"), (np.dtype("int8"), "int8"), (float, "float64"), (int, "int64"),
                        (bool, "bool")]:
        assert gk._C.dtype_name(gk.zeros(1, dtype=alias).dtype) == name


def _round_format(x, mbits, emin, maxval, saturate):
    """Independent round-to-nearest-even of float64 values into a binary format with `mbits`
    stored mantissa bits and smallest normal exponent `emin` (subnormals below it)."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    for i, v in np.ndenumerate(x):
        if math.isnan(v):
            out[i] = v
            continue
        if math.isinf(v):
            out[i] = math.copysign(maxval, v) if saturate else v
            continue
        if v == 0:
            out[i] = v
            continue
        e = max(math.frexp(abs(v))[1] - 1, emin)
        q = 2.0 ** (e - mbits)
        r = np.rint(v / q) * q  # rint rounds half to even
        if abs(r) > maxval:
            r = math.copysign(maxval, v) if saturate else math.copysign(math.inf, v)
        out[i] = r
    return out


FORMATS = {  # name: (stored mantissa bits, smallest normal exponent, largest finite, saturates)
    "bfloat16": (7, -126, float.fromhex("0x1.fep127"), False),
    "float16": (10, -14, 65504.0, False),
    "float8_e4m3fn": (3, -6, 448.0, True),
    "float8_e5m2": (2, -14, 57344.0, True),
}


def _hard_float32_values(rng, fmt):
    mbits, emin, maxval, _ = FORMATS[fmt]
    v = [0.0, -0.0, 1.0, -1.0, maxval, -maxval, maxval * 1.01, 2.0 ** emin, 2.0 ** (emin - mbits),
         2.0 ** (emin - mbits - 1), 3 * 2.0 ** (emin - mbits - 1), np.inf, -np.inf, np.nan, 1e30, -1e-30]
    # exact ties between neighbours and values just around them
    base = rng.uniform(-1, 1, 400) * 2.0 ** rng.integers(emin - mbits, 8, 400)
    q = 2.0 ** (np.floor(np.log2(np.abs(base))) - mbits)
    ties = (np.floor(base / q) + 0.5) * q
    v = np.concatenate([v, base, ties, np.nextafter(ties.astype(np.float32), np.float32(np.inf)),
                        rng.standard_normal(2000) * 100])
    return np.clip(v, -3e38, 3e38).astype(np.float32)  # float32 sources: no double rounding involved


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("device", DEVICES)
def test_float32_to_narrow_rounds_to_nearest_even(fmt, device, rng):
    src = _hard_float32_values(rng, fmt)
    got = np_of(gk.asarray(src, device=device).astype(fmt))
    want = _round_format(src.astype(np.float64), *FORMATS[fmt])
    bad = ~((got == want) | (np.isnan(got) & np.isnan(want)))
    assert not bad.any(), f"{fmt}: {src[bad][:5]} -> {got[bad][:5]}, want {want[bad][:5]}"
    # the sign of zero is kept
    assert np.array_equal(np.signbit(got[src == 0]), np.signbit(src[src == 0]))


def test_float64_to_bfloat16_rounds_once():
    x = 1.0 + 2.0 ** -8 + 2.0 ** -30  # just above a bf16 tie; float32 rounding lands on the tie
    assert harness.values(gk.asarray(np.array([x])).astype("bfloat16"))[0] == 1.0 + 2.0 ** -7


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("src_dtype", [np.float64, np.int32, np.int64])
@pytest.mark.parametrize("device", DEVICES)
def test_wide_to_narrow_rounds_once(fmt, src_dtype, device, rng):
    mbits, emin, _, _ = FORMATS[fmt]
    # values near the format's ties, perturbed below float32 resolution, plus random ones
    if src_dtype == np.float64:
        base = np.ldexp(1.0 + (rng.integers(0, 2 ** mbits, 3000) + 0.5) / 2 ** mbits, rng.integers(-6, 7, 3000))
        tiny = np.ldexp(1.0, -40) * rng.choice([-1.0, 1.0], 3000) * base
        src = np.concatenate([base + tiny, -(base - tiny), rng.standard_normal(1000) * 100])
    else:
        hi = 2 ** 31 - 1 if src_dtype == np.int32 else 2 ** 53
        src = np.concatenate([rng.integers(-hi, hi, 3000), (1 << 24) + 1 + 2 * rng.integers(0, 1 << 20, 500)])
    src = src.astype(src_dtype)
    got = np_of(gk.asarray(src, device=device).astype(fmt))
    want = _round_format(src.astype(np.float64), *FORMATS[fmt])
    bad = ~((got == want) | (np.isnan(got) & np.isnan(want)))
    assert not bad.any(), f"{fmt}: {src[bad][:5]} -> {got[bad][:5]}, want {want[bad][:5]}"


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2", "float16", "bfloat16"])
def test_every_bit_pattern_widens_exactly(fmt):
    nbits = gk.zeros(1, dtype=fmt).itemsize * 8
    pats = np.arange(2 ** nbits, dtype=np.int64).astype(np.uint16 if nbits == 16 else np.uint8)
    raw = gk.asarray(pats.view(np.int16) if nbits == 16 else pats)
    x = raw.view_dtype(fmt)
    got = harness.values(x)
    mbits, emin, _, _ = FORMATS[fmt]
    ebits = nbits - 1 - mbits
    p = pats.astype(np.int64)
    sign = np.where(p >> (nbits - 1), -1.0, 1.0)
    e = (p >> mbits) & ((1 << ebits) - 1)
    m = p & ((1 << mbits) - 1)
    want = np.where(e == 0, m * 2.0 ** (emin - mbits), (1 + m / 2.0 ** mbits) * 2.0 ** (e.astype(np.float64) + emin - 1))
    top = (1 << ebits) - 1
    if fmt == "float8_e4m3fn":
        want = np.where((e == top) & (m == 7), np.nan, want)  # no infinities
    else:
        want = np.where(e == top, np.where(m == 0, np.inf, np.nan), want)
    want = sign * want
    ok = (got == want) | (np.isnan(got) & np.isnan(want))
    assert ok.all(), f"{fmt}: patterns {pats[~ok][:5]} -> {got[~ok][:5]}, want {want[~ok][:5]}"
    # and back: narrow -> float32 -> narrow keeps every non-NaN pattern
    back = harness.bits(x.astype("float32").astype(fmt)).astype(np.int64) & (2 ** nbits - 1)
    keep = np.isfinite(want) | (fmt in ("float16", "bfloat16"))
    keep &= ~np.isnan(want)
    assert np.array_equal(back[keep], p[keep])
    if fmt == "float8_e5m2":  # fp8 saturates: infinities become the largest finite value
        assert back[p == 0x7C][0] == 0x7B and back[p == 0xFC][0] == 0xFB


@needs_ml_dtypes
@pytest.mark.parametrize("fmt", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_conversions_agree_with_ml_dtypes(fmt, rng):
    src = _hard_float32_values(rng, fmt)
    src = src[np.abs(src) < FORMATS[fmt][2]]  # ml_dtypes does not saturate
    want = src.astype(getattr(ml_dtypes, fmt)).astype(np.float64)
    got = harness.values(gk.asarray(src).astype(fmt))
    assert np.array_equal(np.nan_to_num(got), np.nan_to_num(want))
    # .numpy() of these dtypes gives ml_dtypes arrays
    assert gk.asarray(src[:4]).astype(fmt).numpy().dtype == np.dtype(getattr(ml_dtypes, fmt))


@pytest.mark.parametrize("device", DEVICES)
def test_float_to_int_truncates_and_clamps(device):
    src = np.array([-2.7, -0.5, 0.5, 2.7, 1e10, -1e10, np.nan, np.inf, 200.9, -129.5], np.float32)
    got = gk.asarray(src, device=device).astype("int8").to("cpu").numpy()
    assert got.tolist() == [-2, 0, 0, 2, 127, -128, 0, 127, 127, -128]
    assert gk.asarray(src[:4], device=device).astype("bool").to("cpu").numpy().tolist() == [True] * 4
    assert gk.asarray(np.array([0.0, -0.0, np.nan]), device=device).astype("bool").to("cpu").numpy().tolist() == \
        [False, False, True]


# ---------------------------------------------------------------- promotion

NP_TYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]


def test_promotion_table_matches_documented_rules():
    P = lambda a, b: gk._C.dtype_name(gk.promote_types(a, b))  # noqa: E731
    ints = ["uint8", "int8", "int16", "int32", "int64"]
    floats = ["float8_e4m3fn", "float8_e5m2", "float16", "bfloat16", "float32", "float64"]
    for a in ALL_DTYPES:
        for b in ALL_DTYPES:
            assert P(a, b) == P(b, a), (a, b)
        assert P(a, a) == a and P("bool", a) == a
    for a in ints + ["bool"]:
        for b in ints + ["bool"]:
            assert P(a, b) == str(np.promote_types(a, b)), (a, b)  # integers promote like NumPy
    for i in ints:
        for f in floats:
            assert P(i, f) == f, (i, f)  # an integer with a float gives the float
    assert P("float16", "bfloat16") == "float32"
    assert P("float8_e4m3fn", "float8_e5m2") == "float16"
    assert P("float8_e4m3fn", "bfloat16") == "bfloat16"
    assert P("float16", "float32") == "float32" and P("bfloat16", "float64") == "float64"


def test_op_results_follow_promotion():
    for a in ALL_DTYPES:
        for b in ALL_DTYPES:
            x, y = gk.ones(2, dtype=a), gk.ones(2, dtype=b)
            want = gk.promote_types(a, b)
            assert gk.mul(x, y).dtype == want, (a, b)
            assert gk.lt(x, y).dtype == gk.bool_
            d = gk.div(x, y).dtype
            assert d == (want if gk._C.dtype_name(want).startswith(("float", "bfloat")) else gk.float32), (a, b)


def test_python_scalars_are_weak():
    i8 = gk.ones(2, dtype="int8")
    assert (i8 + 1).dtype == gk.int8
    assert (i8 + 1.5).dtype == gk.float32
    assert (gk.ones(2, dtype="float16") * 3.0).dtype == gk.float16
    assert (gk.ones(2, dtype="bool") + 1).dtype == gk.int64
    assert (gk.ones(2, dtype="bfloat16") > 0.5).dtype == gk.bool_
    assert (2 ** gk.arange(4)).numpy().tolist() == [1, 2, 4, 8]
    assert (1.0 - gk.ones(2, dtype="float64")).dtype == gk.float64


# ---------------------------------------------------------------- repr, conversion to Python

def test_repr_and_python_conversions():
    a = gk.arange(6, dtype=gk.float32).reshape(2, 3)
    r = repr(a)
    assert r.startswith("gk.array([[0., 1., 2.],") and r.endswith("dtype=float32)")
    assert "5." in str(a)
    assert repr(gk.asarray(True)) == "gk.array(True, dtype=bool)"
    assert "dtype=int8" in repr(gk.zeros(2, dtype="int8"))
    assert "bfloat16" in repr(gk.ones(3, dtype="bfloat16"))
    assert float(gk.asarray(2.5)) == 2.5 and int(gk.asarray(7)) == 7
    assert a.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert a[1, 2].item() == 5.0
    assert len(a) == 2 and [x.shape for x in a] == [(3,), (3,)]
    assert bool(gk.asarray([1]))
    with pytest.raises(ValueError):
        bool(a)
    with pytest.raises(ValueError):
        a.item()


# ---------------------------------------------------------------- indexing and setitem

KEYS = [1, -1, (0, 2), (slice(None), 1), slice(1, 3), slice(None, None, 2), slice(None, None, -1),
        (Ellipsis, 1), (None, 1), (1, slice(None), slice(None, None, -2)), (slice(None), None, slice(2, None)),
        slice(10, 20), slice(-100, 100), (slice(3, 1), 0), (Ellipsis,), (), (0, 0, 0), (slice(None, None, 3), Ellipsis, None)]


@pytest.mark.parametrize("key", KEYS, ids=repr)
@pytest.mark.parametrize("device", DEVICES)
def test_getitem_matches_numpy(key, device):
    ref = np.arange(3 * 4 * 5, dtype=np.float64).reshape(3, 4, 5)
    a = gk.asarray(ref, device=device)
    v, r = a[key], ref[key]
    assert v.shape == np.shape(r)
    np.testing.assert_array_equal(np_of(v), r)


@pytest.mark.parametrize("key", KEYS, ids=repr)
@pytest.mark.parametrize("device", DEVICES)
def test_setitem_matches_numpy(key, device, rng):
    ref = np.zeros((3, 4, 5))
    a = gk.zeros((3, 4, 5), dtype=gk.float64, device=device)
    shape = np.shape(ref[key])
    val = rng.standard_normal(shape)
    ref[key] = val
    a[key] = gk.asarray(val, device=device)
    np.testing.assert_array_equal(np_of(a), ref)
    ref[key] = 2.5
    a[key] = 2.5
    np.testing.assert_array_equal(np_of(a), ref)
    if len(shape):
        row = rng.standard_normal(shape[-1:])
        ref[key] = row
        a[key] = row  # NumPy value, broadcast
        np.testing.assert_array_equal(np_of(a), ref)


def test_setitem_converts_dtype_and_handles_overlap():
    a = gk.arange(10, dtype=gk.int32)
    a[2:5] = gk.asarray(np.array([1.9, -2.9, 3.5], np.float32))
    assert a.numpy().tolist()[2:5] == [1, -2, 3]
    b = gk.arange(10, dtype=gk.float32)
    b[1:] = b[:-1]  # overlapping source and destination
    assert b.numpy().tolist() == [0, 0, 1, 2, 3, 4, 5, 6, 7, 8]


# ---------------------------------------------------------------- bad input

def _raises(exc, fn, *words):
    with pytest.raises(exc) as ei:
        fn()
    msg = str(ei.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return msg


def test_bad_dtypes():
    b = gk.ones(3, dtype="bool")
    _raises(TypeError, lambda: gk.zeros(3, dtype="float17"), "dtype", "float17")
    _raises(TypeError, lambda: gk.zeros(3, dtype=""), "dtype")
    _raises(TypeError, lambda: gk.zeros(3, dtype=np.complex64), "dtype", "complex64")
    _raises(TypeError, lambda: gk.zeros(3).astype("int3"), "dtype")
    _raises(TypeError, lambda: gk.promote_types("bf32", "int8"), "a:")
    _raises(TypeError, lambda: gk.sub(b, b), "b:", "bool")
    _raises(TypeError, lambda: -b, "x:", "logical_not")
    _raises(TypeError, lambda: ~gk.ones(2), "x:")
    _raises(TypeError, lambda: gk.clamp(b, 0, 1), "x:", "bool")
    _raises(TypeError, lambda: gk.asarray(np.zeros(2, np.complex64)), "complex64")
    _raises(TypeError, lambda: gk.asarray("text"), "array")
    _raises(TypeError, lambda: gk.add(gk.ones(2), "x"), "b:")
    _raises(TypeError, lambda: gk.full(2, "x"), "fill_value")
    _raises(TypeError, lambda: gk.add(gk.ones(2), gk.ones(2), stream="s"), "stream")
    _raises(ValueError, lambda: gk.ones(2, dtype="int8") + 300, "b:", "300", "int8")
    _raises(ValueError, lambda: gk.clamp(gk.ones(2, dtype="uint8"), -1, 3), "min")
    _raises(ValueError, lambda: gk.full(2, 2 ** 70), "fill_value")
    _raises(ValueError, lambda: gk.gelu(gk.ones(2), approximate="fast"), "approximate")


def test_mismatched_shapes():
    a, b = gk.ones((2, 3)), gk.ones((4,))
    _raises(ValueError, lambda: gk.add(a, b), "(2, 3)", "(4,)")
    _raises(ValueError, lambda: a * b, "(2, 3)", "(4,)")
    _raises(ValueError, lambda: gk.where(gk.ones(2, dtype="bool"), a, a), "(2,)", "(2, 3)")
    _raises(ValueError, lambda: gk.copy_into(a, b), "src", "(4,)")
    _raises(ValueError, lambda: gk.copy_into(gk.ones(3), gk.ones((2, 3))), "src")
    _raises(ValueError, lambda: a.reshape(4, 2), "shape", "(2, 3)")
    _raises(ValueError, lambda: a.reshape(-1, -1), "shape")
    _raises(ValueError, lambda: a.broadcast_to((3, 3)), "shape", "(2, 3)")
    _raises(ValueError, lambda: a.permute(0, 0), "dims")
    _raises(ValueError, lambda: a.squeeze(0), "dim")
    _raises(ValueError, lambda: a.T.reshape(6), "shape")
    _raises(ValueError, lambda: a.as_strided((3, 3), (3, 1)), "strides")
    _raises(ValueError, lambda: a[:, ::2].view_dtype("int16"), "dtype")
    with pytest.raises(ValueError):
        a[0] = gk.ones(4)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_size_dimensions(device):
    e = gk.zeros((3, 0, 5), device=device)
    assert e.size == 0 and e.nbytes == 0
    assert (e + 1).shape == (3, 0, 5)
    assert (e + gk.ones((1, 5), device=device)).shape == (3, 0, 5)
    assert gk.exp(e).shape == (3, 0, 5)
    assert e.reshape(0, 15).shape == (0, 15) and e.T.shape == (5, 0, 3)
    assert e[1:1].shape == (0, 0, 5) and e.contiguous().shape == (3, 0, 5)
    assert gk.where(gk.zeros((0,), dtype="bool", device=device), 1.0, 2.0).shape == (0,)
    assert gk.ones((0,), device=device).to("cpu").numpy().shape == (0,)
    e[...] = 5  # writes nothing
    _raises(ValueError, lambda: e + gk.ones((2, 5), device=device), "(3, 0, 5)", "(2, 5)")
    _raises(ValueError, lambda: gk.zeros((0, 3)).reshape(-1, 0), "shape")


def test_shapes_whose_byte_size_overflows():
    _raises(ValueError, lambda: gk.empty((2 ** 40, 2 ** 40)), "shape", "64 bits")
    _raises(ValueError, lambda: gk.empty((2 ** 61, 2), dtype="float64"), "shape", "64 bits")
    _raises(ValueError, lambda: gk.empty((2 ** 62,), dtype="float32"), "shape")
    _raises(ValueError, lambda: gk.empty((2 ** 63,)), "shape")
    _raises(ValueError, lambda: gk.zeros((2 ** 64, 1)), "shape")
    _raises(ValueError, lambda: gk.empty((-1, 3)), "shape", "negative")
    _raises(ValueError, lambda: gk.ones(1).broadcast_to((2 ** 40, 2 ** 40, 4)), "shape")
    _raises(ValueError, lambda: gk.zeros((0,)).reshape(2 ** 62, 2 ** 62, 0), "shape")
    _raises(ValueError, lambda: gk.arange(0, 1e30, 1e-30), "stop")
    _raises(ValueError, lambda: gk.arange(0, 10, 0), "step")
    _raises(ValueError, lambda: gk.arange(0, float("inf")), "finite")
    # a huge but representable request is an out-of-memory error, not a crash
    with pytest.raises(MemoryError):
        gk.empty((2 ** 59,), dtype="int8")


def test_out_of_range_indices_and_slices():
    a = gk.arange(12).reshape(3, 4)
    _raises(IndexError, lambda: a[3], "index", "3", "size 3")
    _raises(IndexError, lambda: a[-4], "index")
    _raises(IndexError, lambda: a[0, 4], "index")
    _raises(IndexError, lambda: a[0, 0, 0], "too many indices")
    _raises(IndexError, lambda: a[..., ...], "ellipsis")
    _raises(IndexError, lambda: a[[0, 1]], "index")
    _raises(IndexError, lambda: a[1.0], "index")
    _raises(IndexError, lambda: a.narrow(1, 2, 3), "narrow")
    _raises(IndexError, lambda: a.narrow(0, -5, 1), "narrow")
    _raises(IndexError, lambda: a.select(2, 0), "dim")
    _raises(IndexError, lambda: a.transpose(0, 2), "dim1")
    _raises(IndexError, lambda: a.unsqueeze(4), "dim")
    _raises(IndexError, lambda: a.squeeze(5), "dim")
    _raises(ValueError, lambda: a[::0], "step")
    _raises(TypeError, lambda: a["x":], "slice")
    with pytest.raises(IndexError):
        a[5] = 1
    # slices clamp like Python and NumPy: out-of-range bounds give short or empty views
    assert a[1:100].shape == (2, 4) and a[100:].shape == (0, 4) and a[:, -100:2].shape == (3, 2)
    assert a[::-1][5:].shape == (0, 4)


def test_invalid_devices():
    _raises(ValueError, lambda: gk.zeros(2, device="gpu"), "device", "gpu")
    _raises(ValueError, lambda: gk.zeros(2, device="cuda:-1"), "device")
    _raises(ValueError, lambda: gk.zeros(2, device="cpu:1"), "device")
    _raises(ValueError, lambda: gk.zeros(2, device=""), "device")
    _raises(ValueError, lambda: gk.zeros(2, device="cuda:x"), "device")
    _raises(ValueError, lambda: gk.zeros(2, device="cuda:99"), "device")
    _raises(ValueError, lambda: gk.ones(2).to("cuda:99"), "device")
    _raises(TypeError, lambda: gk.zeros(2, device=3.5), "device")
    _raises(ValueError, lambda: gk.Device("tpu"), "device")
    if not HAS_CUDA:
        _raises(ValueError, lambda: gk.zeros(2, device="cuda"), "device")


@needs_cuda
def test_arrays_on_different_devices():
    c, g = gk.ones(3), gk.ones(3, device="cuda")
    _raises(ValueError, lambda: gk.add(c, g), "b:", "cpu", "cuda:0")
    _raises(ValueError, lambda: g * c, "cuda:0", "cpu")
    _raises(ValueError, lambda: gk.where(gk.ones(3, dtype="bool"), g, g), "cond")
    _raises(ValueError, lambda: gk.where(gk.ones(3, dtype="bool", device="cuda"), c, g), "a:")
    # copies across devices are explicit and allowed
    gk.copy_into(c, g * 2)
    assert c.numpy().tolist() == [2, 2, 2]
