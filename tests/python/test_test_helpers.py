"""The shared test helpers can fail (no GPU needed): w4_ref.py (the 4-bit GEMV tests' bound, checks and data) and
decode_chain.py (the decode chain tests' chain and step check, run here on the CPU backend)."""
import numpy as np
import pytest

import gpukit as gk
from decode_chain import chain_outs, check_chain
from test_attention import make
from test_attention_decode import bits
from w4_ref import bound_f32, check_exact, mma_order, same_bits, w4_weights, within


def test_w4_bound_and_checks_can_fail():
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((3, 256))
    deq = rng.standard_normal((5, 256))
    ref = xs @ deq.T
    tol = bound_f32(xs, deq)
    assert tol.shape == (3, 5) and np.all(tol > 0)
    np.testing.assert_array_equal(bound_f32(xs, deq, 256), tol)
    within("exact", ref, ref, tol)
    check_exact("exact", ref.astype(np.float32), xs, deq)  # float32 rounding of the result: inside the bound
    bad = ref.copy()
    bad[2, 3] += 3 * tol[2, 3]
    with pytest.raises(AssertionError, match=r"1 of 15 out of the bound; .*first bad \[2, 3\]"):
        within("off", bad, ref, tol)
    with pytest.raises(AssertionError, match="out of the bound"):
        check_exact("off", bad, xs, deq)
    nan = ref.copy()
    nan[0, 0] = np.nan
    with pytest.raises(AssertionError, match="non-finite 1"):
        within("nan", nan, ref, tol)


def test_same_bits_sees_one_ulp():
    a = np.linspace(-1, 1, 12).reshape(3, 4)
    same_bits("same", a, a.copy())
    b = a.copy()
    b[1, 2] = np.nextafter(b[1, 2], np.inf)
    with pytest.raises(AssertionError, match=r"1 of 12 differ; first \[1, 2\]"):
        same_bits("ulp", a, b)


def test_w4_weights_and_mma_order():
    w = w4_weights(np.random.default_rng(1), 4, 100)
    w2 = (np.random.default_rng(1).standard_normal((4, 100)) / 10.0).astype(np.float32)
    w2[:, :64] *= 8.0
    np.testing.assert_array_equal(w, w2)
    q = np.arange(8, dtype=np.uint8).reshape(2, 4)
    assert mma_order(mma_order(q)).shape == q.shape


def test_decode_chain_step_check_can_fail():
    # the CPU backend: a chain of 3 calls checked against the float64 reference and its own bits; a base with one
    # element changed must fail
    B, T, Hq, Hkv, D = 2, 24, 4, 2, 64
    q, kc, vc = make((B, Hq, D), "float32", 11), make((B, T, Hkv, D), "float32", 12), make((B, T, Hkv, D), "float32", 13)
    lens = gk.asarray(np.array([T, 7], np.int32))
    outs = chain_outs(q, kc, vc, lens, 3)
    base = [bits(o) for o in outs]
    kk, vv = np.float64(gk.to_numpy(kc)), np.float64(gk.to_numpy(vc))
    ln = np.array([T, 7], np.int32)
    check_chain(outs, q, kk, vv, ln, base, "cpu chain", "itself")
    base[2] = base[2].copy()
    base[2][1, 3, 5] ^= 1
    with pytest.raises(AssertionError, match=r"cpu chain step 2 differs from itself at \[1 3 5\]"):
        check_chain(outs, q, kk, vv, ln, base, "cpu chain", "itself")
