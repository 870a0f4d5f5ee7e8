"""attention_prefill on CUDA for bf16/fp16 (the wgmma kernel on sm_90, the generic kernel elsewhere)
against a float64 NumPy reference: odd lengths, GQA, head dims, varlen batches, cached prefixes,
causal and bidirectional, window/soft-cap, strided views, poisoned outputs, bitwise determinism and
independence from the rest of the batch. Failures print the max error and the first bad index."""
import math

import numpy as np
import pytest

import gpukit as gk

CUDA = gk.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="no CUDA device")
TOL = {"bfloat16": 2e-2, "float16": 4e-3}


_VARIANT_ENV = {"sm90pp": "3", "sm90ws": "2", "sm90p3": "4", "sm90ps": "5", "sm90s3": "6", "sm90cp": "1",
                "sm90hs1": "5:1", "sm90prof": "5:0:1"}


@pytest.fixture(autouse=True, params=list(_VARIANT_ENV))
def kernel_variant(request, monkeypatch):
    """Runs each test with each sm_90 kernel (GPUKIT_PREFILL_SM90): the warp-specialized TMA kernel
    with ping-pong scheduling (3), without it (2), with three K/V stages (4), in a persistent grid
    (5, the default; one sequence only, else as 3), persistent with three stages (6) and the
    cp.async kernel (1); and the persistent kernel in sections of one head (GPUKIT_PREFILL_SM90_HS=1)
    and its cycle-profile build (GPUKIT_PREFILL_SM90_PROF=1, bf16 head_dim 128; the profile goes to
    stderr). The persistent bf16 / fp16 head_dim 128 kernels run the speculative softmax (OPT bits
    8736 of attention_prefill_sm90_ws.cu), the others no OPT bits. Elsewhere all of them run the
    generic kernel. Select one with -k sm90pp etc."""
    variant, *rest = _VARIANT_ENV[request.param].split(":")
    monkeypatch.setenv("GPUKIT_PREFILL_SM90", variant)
    for name in _TUNING_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, val in zip(_TUNING_ENV, rest):
        if val != "0":
            monkeypatch.setenv(name, val)
    monkeypatch.setenv("GPUKIT_PREFILL_SM90_LOG", "1")  # stderr names the kernel that ran
    return request.param


_TUNING_ENV = ("GPUKIT_PREFILL_SM90_HS", "GPUKIT_PREFILL_SM90_PROF")


def make(shape, dtype, seed=0, scale=1.0):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale
    return gk.asarray(a).astype(dtype)


def f64(x):
    return np.asarray(gk.to_numpy(x), dtype=np.float64)


def ref(q, k, v, cuq, cuk, causal=True, scale=None, window=None, softcap=None):
    """float64 attention; q [Tq, Hq, D], k, v [Tk, Hkv, D]; rows without keys give 0."""
    Tq, Hq, D = q.shape
    G = Hq // k.shape[1]
    scale = 1 / math.sqrt(D) if scale is None else scale
    out = np.zeros_like(q)
    for b in range(len(cuq) - 1):
        q0, Lq, k0, Lk = int(cuq[b]), int(cuq[b + 1] - cuq[b]), int(cuk[b]), int(cuk[b + 1] - cuk[b])
        if Lq == 0 or Lk == 0:
            continue
        K = np.repeat(k[k0:k0 + Lk], G, axis=1).transpose(1, 2, 0)  # [Hq, D, Lk]
        V = np.repeat(v[k0:k0 + Lk], G, axis=1).transpose(1, 0, 2)  # [Hq, Lk, D]
        j = np.arange(Lk)
        for c0 in range(0, Lq, 512):
            c1 = min(Lq, c0 + 512)
            s = np.matmul(q[q0 + c0:q0 + c1].transpose(1, 0, 2), K) * scale  # [Hq, rows, Lk]
            if softcap:
                s = softcap * np.tanh(s / softcap)
            p = (np.arange(c0, c1) + Lk - Lq)[:, None]
            ok = np.ones((c1 - c0, Lk), bool)
            if causal:
                ok &= j[None, :] <= p
            if window:
                ok &= j[None, :] > p - window
            s = np.where(ok[None], s, -np.inf)
            m = s.max(axis=2, keepdims=True)
            m = np.where(np.isfinite(m), m, 0.0)
            w = np.exp(s - m)
            den = w.sum(axis=2, keepdims=True)
            o = np.matmul(w, V) / np.where(den > 0, den, 1.0)
            out[q0 + c0:q0 + c1] = o.transpose(1, 0, 2)
    return out


def check(got, want, tol, what=""):
    import os
    env = os.environ.get('GPUKIT_PREFILL_SM90', 'default')
    env += "".join(f" {k[20:]}={os.environ[k]}" for k in _TUNING_ENV if k in os.environ)
    what = f"[{env}] {what}"
    got = np.asarray(got, np.float64)
    err = np.abs(got - want)
    bad = ~(err <= tol + tol * np.abs(want))  # NaN counts as bad
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        e = np.where(np.isnan(err), np.inf, err)
        worst = tuple(int(i) for i in np.unravel_index(np.argmax(e), e.shape))
        msg = (f"{what}: {int(bad.sum())}/{bad.size} bad (token, head, d); max err {e[worst]:.4g} at {worst} "
               f"(got {got[worst]:.5g} want {want[worst]:.5g}); first bad {first} (got {got[first]:.5g} "
               f"want {want[first]:.5g}); rows with a bad value: {np.unique(np.argwhere(bad)[:, 0])[:12].tolist()}")
        print(msg)
        raise AssertionError(msg)
    print(f"{what}: ok, max err {float(err.max()) if err.size else 0.0:.3g}")


def run(q, k, v, cuq=None, cuk=None, dev_cu=False, **kw):
    qd, kd, vd = q.to("cuda"), k.to("cuda"), v.to("cuda")
    if cuq is None:
        return gk.nn.attention_prefill(qd, kd, vd, **kw)
    cq, ck = gk.asarray(np.asarray(cuq, np.int32)), gk.asarray(np.asarray(cuk, np.int32))
    if dev_cu:
        cq, ck = cq.to("cuda"), ck.to("cuda")
    return gk.nn.attention_prefill(qd, kd, vd, cq, ck, **kw)


def case(Tq, Tk, Hq, Hkv, D, dtype, seed=0, qscale=1.0):
    return (make((Tq, Hq, D), dtype, seed + 1, qscale), make((Tk, Hkv, D), dtype, seed + 2),
            make((Tk, Hkv, D), dtype, seed + 3))


@gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("L", [1, 7, 127, 1000, 4097])
def test_single_lengths_d128(L, causal, dtype):
    Hq, Hkv = (2, 1) if L > 2000 else (4, 2)
    q, k, v = case(L, L, Hq, Hkv, 128, dtype, seed=L)
    out = run(q, k, v, causal=causal)
    one = np.array([0, L])
    check(f64(out), ref(f64(q), f64(k), f64(v), one, one, causal), TOL[dtype], f"L={L} causal={causal} {dtype}")


@gpu
@pytest.mark.parametrize("D", [64, 256])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("L", [77, 600])
def test_head_dims(D, causal, L):
    q, k, v = case(L, L, 4, 1, D, "bfloat16", seed=D + L)
    out = run(q, k, v, causal=causal)
    one = np.array([0, L])
    check(f64(out), ref(f64(q), f64(k), f64(v), one, one, causal), TOL["bfloat16"], f"D={D} L={L} causal={causal}")


@gpu
@pytest.mark.parametrize("Hq,Hkv", [(32, 8), (8, 1), (6, 3)])
def test_gqa(Hq, Hkv):
    q, k, v = case(513, 513, Hq, Hkv, 128, "bfloat16", seed=Hq)
    out = run(q, k, v)
    one = np.array([0, 513])
    check(f64(out), ref(f64(q), f64(k), f64(v), one, one), TOL["bfloat16"], f"GQA {Hq}/{Hkv}")


def _varlen(lq, prefix):
    cuq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    cuk = np.concatenate([[0], np.cumsum(np.asarray(lq) + np.asarray(prefix))]).astype(np.int32)
    return cuq, cuk


@gpu
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dev_cu", [False, True])
def test_varlen_prefix(D, causal, dev_cu):
    lq = [1, 0, 130, 257, 64, 1000, 3]
    prefix = [0, 5, 0, 300, 7, 129, 0]  # chunked form: keys = cached prefix + the new tokens
    cuq, cuk = _varlen(lq, prefix)
    q, k, v = case(int(cuq[-1]), int(cuk[-1]), 4, 2, D, "bfloat16", seed=D)
    out = run(q, k, v, cuq, cuk, dev_cu=dev_cu, causal=causal)
    check(f64(out), ref(f64(q), f64(k), f64(v), cuq, cuk, causal), TOL["bfloat16"],
          f"varlen D={D} causal={causal} dev_cu={dev_cu}")


@gpu
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("causal", [True, False])
def test_varlen_poisoned_neighbours(D, causal):
    """The last key tile of a sequence also reads the next sequence's rows. Here those rows hold NaN,
    +-Inf and 3e38 (sequences 1 and 3 have keys but no queries, sequence 4 is all poison, its query
    rows too): they must not reach sequences 0 and 2 (masked scores, zero probabilities, and no
    0 * Inf in P V)."""
    lq, prefix = [100, 0, 37, 0, 20], [0, 28, 5, 60, 0]
    cuq, cuk = _varlen(lq, prefix)
    q, k, v = case(int(cuq[-1]), int(cuk[-1]), 4, 2, D, "bfloat16", seed=D + causal)
    qn, kn, vn = (np.array(gk.to_numpy(x.astype("float32")), np.float32) for x in (q, k, v))
    bad = np.array([np.nan, np.inf, -np.inf, 3e38, -3e38], np.float32)
    for b in (1, 3, 4):
        for a in (kn, vn):
            rows = a[cuk[b]:cuk[b + 1]]
            rows[...] = bad[np.arange(rows.size).reshape(rows.shape) % bad.size]
    qn[cuq[4]:cuq[5]] = np.nan
    q, k, v = (gk.asarray(x).astype("bfloat16") for x in (qn, kn, vn))
    out = f64(run(q, k, v, cuq, cuk, causal=causal))
    want = ref(f64(q), f64(k), f64(v), cuq, cuk, causal)
    for b in (0, 2):
        r = slice(int(cuq[b]), int(cuq[b + 1]))
        check(out[r], want[r], TOL["bfloat16"], f"sequence {b} beside poisoned rows, D={D} causal={causal}")


@gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("Lq,Lk", [(100, 1000), (1, 777), (300, 300), (129, 4000), (50, 20)])
def test_chunked_prefix(Lq, Lk, dtype):
    """Query i sees keys 0 .. Lk - Lq + i; with Lq > Lk the first rows see no key and give 0."""
    q, k, v = case(Lq, Lk, 8, 2, 128, dtype, seed=Lq + Lk)
    cuq, cuk = np.array([0, Lq]), np.array([0, Lk])
    out = run(q, k, v, cuq, cuk)
    check(f64(out), ref(f64(q), f64(k), f64(v), cuq, cuk), TOL[dtype], f"prefix Lq={Lq} Lk={Lk} {dtype}")


@gpu
@pytest.mark.parametrize("kw", [{"window": 100}, {"window": 1}, {"softcap": 30.0},
                                {"window": 257, "softcap": 5.0, "scale": 0.2}, {"scale": -0.05, "causal": False}])
def test_window_softcap_scale(kw):
    q, k, v = case(700, 900, 4, 4, 128, "bfloat16", seed=7, qscale=3.0)
    cuq, cuk = np.array([0, 700]), np.array([0, 900])
    out = run(q, k, v, cuq, cuk, **kw)
    check(f64(out), ref(f64(q), f64(k), f64(v), cuq, cuk, **kw), TOL["bfloat16"], f"{kw}")


@gpu
def test_large_logits():
    """Logits in the hundreds: the online softmax must rescale without overflow."""
    q, k, v = case(600, 600, 2, 2, 128, "bfloat16", seed=3, qscale=40.0)
    one = np.array([0, 600])
    out = run(q, k, v)
    check(f64(out), ref(f64(q), f64(k), f64(v), one, one), TOL["bfloat16"], "large logits")


def _same_bits_under_poisons(fn):
    """fn() (a 16-bit output) under the allocation poisons 0xFF (NaN) and 0x5A and without
    one: every run must give the same bits (every element written). Returns the last output."""
    res = []
    for p in (0xFF, 0x5A, -1):
        gk._C._debug_alloc_poison(p)
        try:
            out = fn()
            gk.cuda.synchronize()
        finally:
            gk._C._debug_alloc_poison(-1)
        res.append(gk.to_numpy(out.to("cpu")).view(np.uint16).copy())
    for i in (1, 2):
        if not np.array_equal(res[0], res[i]):
            diff = np.argwhere(res[0] != res[i])
            raise AssertionError(f"run {i} differs from run 0 at {len(diff)} elements, first {diff[0].tolist()}")
    return out


@gpu
@pytest.mark.parametrize("D", [64, 128, 256])
def test_poisoned_output_and_determinism(D):
    """Every output element is written (poison 0xFF = NaN, 0x5A) and results are bit-identical."""
    cuq, cuk = _varlen([5, 300, 1, 1029], [0, 17, 4, 0])
    q, k, v = case(int(cuq[-1]), int(cuk[-1]), 4, 1, D, "bfloat16", seed=11)
    out = _same_bits_under_poisons(lambda: run(q, k, v, cuq, cuk))
    check(f64(out), ref(f64(q), f64(k), f64(v), cuq, cuk), TOL["bfloat16"], f"poisoned D={D}")


@gpu
def test_persistent_many_items_poisoned_and_deterministic():
    """One sequence (no cu_seqlens: the persistent kernel), more (tile, head) items than
    multiprocessors: every row written under two poisons, bit-identical across runs, correct."""
    L, Hq, Hkv = 2000, 16, 4
    q, k, v = case(L, L, Hq, Hkv, 128, "bfloat16", seed=17)
    out = _same_bits_under_poisons(lambda: run(q, k, v))
    one = np.array([0, L])
    check(f64(out), ref(f64(q), f64(k), f64(v), one, one), TOL["bfloat16"], "persistent, many items")


@gpu
def test_batch_independence():
    """A sequence's output bits do not depend on the other sequences of its batch."""
    lq, prefix = [200, 513, 9], [50, 0, 700]
    cuq, cuk = _varlen(lq, prefix)
    q, k, v = case(int(cuq[-1]), int(cuk[-1]), 8, 2, 128, "bfloat16", seed=5)
    batch = gk.to_numpy(run(q, k, v, cuq, cuk).to("cpu")).view(np.uint16)
    qn, kn, vn = gk.to_numpy(q), gk.to_numpy(k), gk.to_numpy(v)
    for b in range(len(lq)):
        qs = gk.asarray(np.ascontiguousarray(qn[cuq[b]:cuq[b + 1]]))
        ks = gk.asarray(np.ascontiguousarray(kn[cuk[b]:cuk[b + 1]]))
        vs = gk.asarray(np.ascontiguousarray(vn[cuk[b]:cuk[b + 1]]))
        alone = gk.to_numpy(run(qs, ks, vs, [0, lq[b]], [0, lq[b] + prefix[b]]).to("cpu")).view(np.uint16)
        part = batch[cuq[b]:cuq[b + 1]]
        if not np.array_equal(alone, part):
            diff = np.argwhere(alone != part)
            raise AssertionError(f"sequence {b}: {len(diff)} elements differ alone vs in the batch, "
                                 f"first {diff[0].tolist()}")


@gpu
def test_packed_qkv_views():
    """q, k, v as head slices of one packed [T, Hq + 2 Hkv, D] projection (strided, aligned)."""
    T, Hq, Hkv, D = 333, 8, 2, 128
    qkv = make((T, Hq + 2 * Hkv, D), "bfloat16", 21).to("cuda")
    q, k, v = qkv[:, :Hq], qkv[:, Hq:Hq + Hkv], qkv[:, Hq + Hkv:]
    out = gk.nn.attention_prefill(q, k, v)
    one = np.array([0, T])
    check(f64(out), ref(f64(q), f64(k), f64(v), one, one), TOL["bfloat16"], "packed qkv")


@gpu
def test_misaligned_q_falls_back():
    """A q view at an odd element offset cannot be copied with 16-byte vectors: still correct."""
    T, H, D = 70, 2, 64
    big = make((T * H * D + 1,), "bfloat16", 9).to("cuda")
    q = big[1:].reshape(T, H, D)
    k, v = make((T, H, D), "bfloat16", 10).to("cuda"), make((T, H, D), "bfloat16", 11).to("cuda")
    out = gk.nn.attention_prefill(q, k, v)
    one = np.array([0, T])
    check(f64(out), ref(f64(q), f64(k), f64(v), one, one), TOL["bfloat16"], "misaligned q")


def test_reference_matches_loop_reference():
    """The vectorized float64 reference agrees with the plain loop of test_attention.py (CPU only)."""
    from test_attention import ref_prefill
    cuq, cuk = _varlen([3, 0, 9, 5], [2, 1, 0, 4])
    rng = np.random.default_rng(0)
    q = rng.standard_normal((int(cuq[-1]), 4, 16))
    k, v = rng.standard_normal((2, int(cuk[-1]), 2, 16))
    for kw in [{}, {"causal": False}, {"window": 2, "softcap": 1.5}]:
        np.testing.assert_allclose(ref(q, k, v, cuq, cuk, **kw), ref_prefill(q, k, v, cuq, cuk, **kw), rtol=1e-12,
                                   atol=1e-12)
    # and the CPU op itself on one case
    qa, ka, va = case(20, 30, 4, 2, 64, "float32", seed=1)
    out = gk.nn.attention_prefill(qa, ka, va, np.array([0, 20], np.int32), np.array([0, 30], np.int32))
    check(f64(out), ref(f64(qa), f64(ka), f64(va), [0, 20], [0, 30]), 1e-5, "cpu op")


@gpu
@pytest.mark.parametrize("D", [64, 128, 256])
def test_diag_structured(D):
    """Separates the two products when something is wrong: (a) V rows one-hot, so the output row is
    the probability row P (checks S = Q K^T and the softmax); (b) Q = 0, so P is uniform over the
    visible keys and the output is a running mean of V (checks the P V product and V's layout)."""
    L = 64
    rng = np.random.default_rng(D)
    q = rng.standard_normal((L, 1, D)).astype(np.float32)
    k = rng.standard_normal((L, 1, D)).astype(np.float32)
    eye = np.zeros((L, 1, D), np.float32)
    eye[np.arange(L), 0, np.arange(L) % D] = 1.0
    vr = rng.standard_normal((L, 1, D)).astype(np.float32)
    one = np.array([0, L])
    fails = []
    for name, (qq, kk, vv) in {"P via one-hot V": (q, k, eye), "mean of V (Q = 0)": (0 * q, k, vr)}.items():
        qa, ka, va = (gk.asarray(x).astype("bfloat16") for x in (qq, kk, vv))
        got = f64(run(qa, ka, va))
        want = ref(f64(qa), f64(ka), f64(va), one, one)
        err = np.abs(got - want)[:, 0, :]
        print(f"{name} D={D}: max err {np.nanmax(np.where(np.isnan(err), np.inf, err)):.4g}")
        if not (err <= 2e-2).all():
            print("  error map, rows 0..15 x cols 0..15 (x: > 2e-2):")
            for r in range(16):
                print("  " + "".join("x" if not err[r, c] <= 2e-2 else "." for c in range(16)))
            print(f"  got row 3 [:8]  {np.round(got[3, 0, :8], 3).tolist()}")
            print(f"  want row 3 [:8] {np.round(want[3, 0, :8], 3).tolist()}")
            fails.append(name)
    assert not fails, f"structured cases failed: {fails}"


@gpu
def test_env_switch_to_generic_kernel(monkeypatch):
    """GPUKIT_PREFILL_SM90=0 runs the generic CUDA-core kernel: both agree with the reference."""
    cuq, cuk = _varlen([37, 200], [3, 0])
    q, k, v = case(int(cuq[-1]), int(cuk[-1]), 4, 2, 128, "bfloat16", seed=13)
    want = ref(f64(q), f64(k), f64(v), cuq, cuk)
    monkeypatch.setenv("GPUKIT_PREFILL_SM90", "0")
    check(f64(run(q, k, v, cuq, cuk)), want, TOL["bfloat16"], "generic kernel")
    monkeypatch.delenv("GPUKIT_PREFILL_SM90")
    check(f64(run(q, k, v, cuq, cuk)), want, TOL["bfloat16"], "default kernel")
    monkeypatch.setenv("GPUKIT_PREFILL_SM90", "1")
    check(f64(run(q, k, v, cuq, cuk)), want, TOL["bfloat16"], "cp.async kernel")


@gpu
def test_cycle_profile_prints(kernel_variant, capfd):
    """GPUKIT_PREFILL_SM90_PROF=1: the persistent bf16 head_dim 128 kernel runs its cycle-profile build,
    which is still correct and prints the per-phase profile (stderr) whenever that kernel ran."""
    if kernel_variant != "sm90prof":
        pytest.skip("only with the cycle-profile build")
    q, k, v = case(700, 700, 4, 2, 128, "bfloat16", seed=23)
    out = run(q, k, v)
    gk.cuda.synchronize()
    one = np.array([0, 700])
    check(f64(out), ref(f64(q), f64(k), f64(v), one, one), TOL["bfloat16"], "cycle-profile build")
    err = capfd.readouterr().err
    if "persistent kernel" not in err:
        pytest.skip("the persistent sm90 kernel did not run here (not an sm_90 device)")
    assert "prefill prof wg0" in err and "prefill prof wg1" in err and "MHz" in err, err[-2000:]
