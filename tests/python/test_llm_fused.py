"""The engine's decode kernels (src/llm/fused.h, src/cuda/llm_decode.cu): the CPU
references against float64 NumPy, the CUDA kernels against the CPU references (odd
sizes, every M template, strided q/k/v views of one qkv buffer, tokens whose page is
outside the pool, bitwise determinism, a row's bits independent of M), bad input,
and the engine's fusion levels 0/1/2 computing the same model. CUDA parts skip
without a GPU."""
import math

import numpy as np
import pytest

import gpukit as gk
from gpukit import _C

from test_gemv import NP_DT, f64

RNG = np.random.default_rng(11)
CUDA = gk.cuda.is_available()
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
EPS = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24}


def rand(shape, dtype, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(NP_DT[dtype])


def arr(x, device="cpu"):
    a = gk.asarray(x)
    return a.to(device) if device != "cpu" else a


def bits(x):
    return gk.to_numpy(x).tobytes()


def silu(g):
    return g / (1.0 + np.exp(-g))


def rnd(x, dtype):
    return np.asarray(x, np.float64).astype(NP_DT[dtype]).astype(np.float64)


# ---- project ----

def ref_project(x, w, dtype, bias=None, swiglu=False):
    y = f64(x) @ f64(w).T
    if swiglu:
        n = w.shape[0] // 2
        return silu(rnd(y[:, :n], dtype)) * rnd(y[:, n:], dtype)
    if bias is not None:
        y = rnd(y, dtype) + f64(bias)
    return y


def check_close(got, ref, dtype, k, scale=1.0):
    g = f64(got)
    assert g.shape == ref.shape, (g.shape, ref.shape)
    tol = 4 * EPS[dtype] * (np.abs(ref) + scale) + 2 * (k + 2) * 2.0**-24 * scale
    bad = ~(np.abs(g - ref) <= tol)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{bad.sum()} of {bad.size} out of tolerance; first at {i}: {g[i]} vs {ref[i]} "
                             f"(max |diff| {np.max(np.abs(g - ref)):.3g})")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m,k,n", [(1, 64, 5), (3, 136, 9), (8, 24, 4)])
@pytest.mark.parametrize("mode", ["plain", "bias", "swiglu"])
def test_project_cpu(dtype, m, k, n, mode):
    x = rand((m, k), dtype)
    w = rand((2 * n if mode == "swiglu" else n, k), dtype, 1 / math.sqrt(k))
    b = rand((n,), dtype) if mode == "bias" else None
    got = _C.llm.fused_project(arr(x), arr(w), arr(b) if b is not None else None, swiglu=mode == "swiglu")
    check_close(got, ref_project(x, w, dtype, b, mode == "swiglu"), dtype, k)


@cuda_only
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("k,n", [(8, 1), (256, 7), (2048, 33), (4096, 130), (14336, 9), (4104, 6)])
@pytest.mark.parametrize("mode", ["plain", "bias", "swiglu"])
def test_project_cuda(dtype, m, k, n, mode):
    x = rand((m, k), dtype)
    w = rand((2 * n if mode == "swiglu" else n, k), dtype, 1 / math.sqrt(k))
    b = rand((n,), dtype) if mode == "bias" else None
    sw = mode == "swiglu"
    args = lambda d: (arr(x, d), arr(w, d), arr(b, d) if b is not None else None)
    got = _C.llm.fused_project(*args("cuda"), swiglu=sw)
    check_close(got, ref_project(x, w, dtype, b, sw), dtype, k)
    cpu = _C.llm.fused_project(*args("cpu"), swiglu=sw)
    check_close(got, f64(cpu), dtype, k)
    assert bits(_C.llm.fused_project(*args("cuda"), swiglu=sw)) == bits(got), "not deterministic"
    # row 0 alone gives the same bits as within the batch
    one = _C.llm.fused_project(arr(x[:1], "cuda"), *args("cuda")[1:], swiglu=sw)
    assert bits(one) == gk.to_numpy(got)[:1].tobytes(), "row 0 depends on M"


@cuda_only
def test_project_strided_x_view():
    # x a column slice of a wider buffer (rows 16-byte aligned): the kernel reads the rows in place
    big = rand((3, 4096 + 64), "bfloat16")
    w = rand((20, 4096), "bfloat16", 1 / 64)
    xv = arr(big, "cuda")[:, 64:]
    got = _C.llm.fused_project(xv, arr(w, "cuda"))
    check_close(got, ref_project(big[:, 64:], w, "bfloat16"), "bfloat16", 4096)


def test_project_bad_input():
    x, w = arr(rand((2, 16), "bfloat16")), arr(rand((4, 16), "bfloat16"))
    with pytest.raises(ValueError, match="at most 8 rows"):
        _C.llm.fused_project(arr(rand((9, 16), "bfloat16")), w)
    with pytest.raises(ValueError, match="features"):
        _C.llm.fused_project(arr(rand((2, 8), "bfloat16")), w)
    with pytest.raises(TypeError):
        _C.llm.fused_project(arr(rand((2, 16), "float16")), w)
    with pytest.raises(TypeError):
        _C.llm.fused_project(arr(rand((2, 16), "float32")), arr(rand((4, 16), "float32")))
    with pytest.raises(ValueError, match="even"):
        _C.llm.fused_project(x, arr(rand((3, 16), "bfloat16")), swiglu=True)
    with pytest.raises(ValueError, match="bias"):
        _C.llm.fused_project(x, w, arr(rand((3,), "bfloat16")))


# ---- rope_append ----

def inv_freq(theta, rd):
    return (1.0 / theta ** (np.arange(0, rd, 2, dtype=np.float64) / rd)).astype(np.float32)


def ref_rope(x, pos, theta, rd, il):
    """x [T, H, D] float64, rotated at pos[t] over the first rd dims."""
    out = x.copy()
    n = rd // 2
    f = inv_freq(theta, rd).astype(np.float64)
    ang = (np.asarray(pos, np.float32)[:, None] * f[None, :].astype(np.float32)).astype(np.float64)
    cs, sn = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    i1 = np.arange(n) * 2 if il else np.arange(n)
    i2 = i1 + 1 if il else i1 + n
    x1, x2 = x[..., i1], x[..., i2]
    out[..., i1] = x1 * cs - x2 * sn
    out[..., i2] = x2 * cs + x1 * sn
    return out


def rope_case(dtype, T, hq, hkv, D, bs, nb, device, rd=None, il=False, bad_page=False):
    qkv = rand((T, (hq + 2 * hkv) * D), dtype)
    pos = RNG.integers(0, 3 * bs, size=T).astype(np.int32)
    maxb = 3
    bt = RNG.permutation(nb)[: T * maxb].reshape(T, maxb).astype(np.int32) if nb >= T * maxb else \
        RNG.integers(0, nb, size=(T, maxb)).astype(np.int32)
    if bad_page:
        bt[0, pos[0] // bs] = nb + 5      # outside the pool: token 0 is not stored
        pos[1] = 3 * bs + 2               # past the table: token 1 is not stored
    kc = np.full((nb, bs, hkv, D), 7, NP_DT[dtype])
    vc = np.full((nb, bs, hkv, D), 7, NP_DT[dtype])
    a = arr(qkv.copy(), device)  # on the CPU the array shares the NumPy buffer
    q = a[:, : hq * D].reshape((T, hq, D))
    k = a[:, hq * D: (hq + hkv) * D].reshape((T, hkv, D))
    v = a[:, (hq + hkv) * D:].reshape((T, hkv, D))
    kca, vca = arr(kc, device), arr(vc, device)
    _C.llm.fused_rope_append(q, k, v, kca, vca, arr(pos, device), arr(bt, device), theta=10000.0,
                             rotary_dim=rd, interleaved=il)
    return qkv, pos, bt, gk.to_numpy(q), gk.to_numpy(kca), gk.to_numpy(vca)


def check_rope_append(dtype, T, hq, hkv, D, bs, nb, device, rd=None, il=False, bad_page=False):
    qkv, pos, bt, q, kc, vc = rope_case(dtype, T, hq, hkv, D, bs, nb, device, rd, il, bad_page)
    r = rd or D
    x = f64(qkv)
    q0 = x[:, : hq * D].reshape(T, hq, D)
    k0 = x[:, hq * D: (hq + hkv) * D].reshape(T, hkv, D)
    v0 = x[:, (hq + hkv) * D:].reshape(T, hkv, D)
    tol = 4 * EPS[dtype] * 2 + 1e-6
    np.testing.assert_allclose(f64(q), ref_rope(q0, pos, 10000.0, r, il), atol=tol)
    kr = ref_rope(k0, pos, 10000.0, r, il)
    stored = np.zeros((nb, bs), bool)
    for t in range(T):
        li = pos[t] // bs
        if li >= bt.shape[1] or not (0 <= bt[t, li] < nb):
            continue
        blk, off = bt[t, li], pos[t] % bs
        stored[blk, off] = True
        np.testing.assert_allclose(f64(kc[blk, off]), kr[t], atol=tol, err_msg=f"k of token {t}")
        assert f64(vc[blk, off]).tobytes() == v0[t].tobytes() or np.array_equal(f64(vc[blk, off]), v0[t]), t
    untouched = f64(kc)[~stored]
    assert np.all(untouched == 7) and np.all(f64(vc)[~stored] == 7), "a slot outside the tokens' was written"
    return q, kc, vc


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("il", [False, True])
def test_rope_append_cpu(dtype, il):
    check_rope_append(dtype, 3, 4, 2, 16, 16, 12, "cpu", il=il, bad_page=True)
    check_rope_append(dtype, 2, 2, 1, 32, 16, 8, "cpu", rd=16, il=il)


@cuda_only
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(1, 32, 8, 128, 16, 64), (5, 4, 2, 64, 32, 40), (3, 6, 3, 96, 16, 20)])
@pytest.mark.parametrize("il", [False, True])
def test_rope_append_cuda(dtype, shape, il):
    T, hq, hkv, D, bs, nb = shape
    seed = RNG.bit_generator.state
    got = check_rope_append(dtype, T, hq, hkv, D, bs, nb, "cuda", il=il, bad_page=T >= 2)
    RNG.bit_generator.state = seed  # the same case on the CPU reference
    ref = check_rope_append(dtype, T, hq, hkv, D, bs, nb, "cpu", il=il, bad_page=T >= 2)
    for g, c in zip(got, ref):  # CUDA sincosf vs the CPU's cos/sin: at most one rounding step apart
        np.testing.assert_allclose(f64(g), f64(c), atol=2 * EPS[dtype] * 2 + 1e-6)


@cuda_only
def test_rope_append_partial_rotary_cuda():
    check_rope_append("bfloat16", 2, 4, 2, 64, 16, 10, "cuda", rd=32)


def test_rope_append_bad_input():
    q = arr(rand((2, 4, 16), "float32"))
    k = arr(rand((2, 2, 16), "float32"))
    kc = arr(np.zeros((4, 16, 2, 16), np.float32))
    pos = arr(np.zeros(2, np.int32))
    bt = arr(np.zeros((2, 2), np.int32))
    with pytest.raises(ValueError, match="positions"):
        _C.llm.fused_rope_append(q, k, k, kc, kc, arr(np.zeros(3, np.int32)), bt)
    with pytest.raises(ValueError, match="block_table"):
        _C.llm.fused_rope_append(q, k, k, kc, kc, pos, arr(np.zeros((3, 2), np.int32)))
    with pytest.raises(ValueError, match="rotary_dim"):
        _C.llm.fused_rope_append(q, k, k, kc, kc, pos, bt, rotary_dim=5)
    with pytest.raises(ValueError, match="k_cache"):
        _C.llm.fused_rope_append(q, k, k, arr(np.zeros((4, 16, 3, 16), np.float32)), kc, pos, bt)
    with pytest.raises(TypeError):
        _C.llm.fused_rope_append(q, arr(rand((2, 2, 16), "bfloat16")), k, kc, kc, pos, bt)


# ---- add_rms_norm ----

def ref_add_norm(x, r, w, dtype, eps):
    s = rnd(f64(x) + f64(r), dtype)
    return s / np.sqrt(np.mean(s * s, axis=1, keepdims=True) + eps) * f64(w), s


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("rows,H", [(1, 64), (3, 100), (2, 4096), (1, 12288)])
def test_add_rms_norm(dtype, rows, H):
    x, r, w = rand((rows, H), dtype), rand((rows, H), dtype), rand((H,), dtype)
    ry, rs = ref_add_norm(x, r, w, dtype, 1e-5)
    devs = ["cpu"] + (["cuda"] if CUDA else [])
    outs = []
    for d in devs:
        y, s = _C.llm.fused_add_rms_norm(arr(x, d), arr(r, d), arr(w, d), 1e-5)
        np.testing.assert_array_equal(f64(s), rs)  # one rounding of the exact sum
        np.testing.assert_allclose(f64(y), ry, atol=2 * EPS[dtype] * np.max(np.abs(ry)) + 1e-6)
        outs.append(f64(y))
    if CUDA:
        y2, _ = _C.llm.fused_add_rms_norm(arr(x, "cuda"), arr(r, "cuda"), arr(w, "cuda"), 1e-5)
        assert f64(y2).tobytes() == outs[1].tobytes()


def test_add_rms_norm_bad_input():
    x = arr(rand((2, 8), "float32"))
    with pytest.raises(ValueError, match="shape"):
        _C.llm.fused_add_rms_norm(x, arr(rand((2, 9), "float32")), arr(rand((8,), "float32")))
    with pytest.raises(ValueError, match="w"):
        _C.llm.fused_add_rms_norm(x, x, arr(rand((7,), "float32")))
    with pytest.raises(TypeError):
        _C.llm.fused_add_rms_norm(x, arr(rand((2, 8), "bfloat16")), arr(rand((8,), "float32")))


# ---- the engine's fusion levels ----

CFG = dict(model_type="llama", vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
           rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
PROMPTS = [[(i * 37 + 11) % 512 for i in range(n)] for n in (5, 14, 30)]


def decode_logits(m, new=12):
    g = _C.llm.Generation(m._m, PROMPTS, max_new_tokens=new, ignore_eos=True, lookahead=False)
    steps, logits = [], []
    while not g.done:
        steps.append(list(g.step()))
        logits.append(np.asarray(gk.to_numpy(g.last_logits()), np.float64))
    return steps, logits


@pytest.mark.parametrize("device,dtype", [("cpu", "float32")] + ([("cuda", "bfloat16"), ("cuda", "float32")]
                                                                  if CUDA else []))
def test_fusion_levels_same_model(device, dtype):
    # Teacher-forced: level 0 and 1 run the tokens level 2 chose; logits agree to rounding.
    m = gk.llm.random_model(CFG, device=device, dtype=dtype, seed=2)
    assert m._m.fusion == 2
    steps, ref = decode_logits(m)
    for level in (1, 0):
        m._m.fusion = level
        cache = m._m.make_cache([len(p) + 12 for p in PROMPTS])
        seqs = [cache.add_sequence() for _ in PROMPTS]
        first = np.asarray(gk.to_numpy(m._m.step(cache, seqs, PROMPTS)), np.float64)
        got = [first] + [np.asarray(gk.to_numpy(m._m.step(cache, seqs, [[x] for x in steps[t - 1]])), np.float64)
                         for t in range(1, len(steps))]
        for t, (a, b) in enumerate(zip(got, ref)):
            rel = float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
            assert rel < (3e-2 if dtype == "bfloat16" else 1e-4), f"level {level} step {t}: max rel diff {rel:.3g}"
    m._m.fusion = 2
    with pytest.raises(ValueError):
        m._m.fusion = 3


@cuda_only
def test_fusion2_graph_equals_eager_and_profile_names():
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=3)
    names = {n for n, _, _ in m.profile_decode(batch=2, context=40, reps=1)}
    # head_dim 64: the fused attention by default since session 7 (RoPE + append inside)
    assert "attention" in names and not names & {"rope_kv", "swiglu", "kv_append", "rope"}, names
    m._m.fused_attention_auto_hd64 = False  # the two-launch path below
    outs = []
    for graph in (False, True):
        g = _C.llm.Generation(m._m, PROMPTS, max_new_tokens=16, ignore_eos=True, cuda_graph=graph, lookahead=False)
        lg = []
        while not g.done:
            g.step()
            lg.append(gk.to_numpy(g.last_logits()).tobytes())
        outs.append((g.generated, lg))
    assert outs[0][0] == outs[1][0]
    assert outs[0][1] == outs[1][1], "graph logits differ from eager"
    names = {n for n, _, _ in m.profile_decode(batch=2, context=40, reps=1)}
    assert {"qkv", "rope_kv", "attention", "o_proj", "norm", "gate_up", "down"} <= names, names
    assert not names & {"swiglu", "kv_append", "rope"}, names
    m._m.rope_in_qkv = True
    names = {n for n, _, _ in m.profile_decode(batch=2, context=40, reps=1)}
    assert {"qkv", "attention", "o_proj", "norm", "gate_up", "down"} <= names, names
    assert "rope_kv" not in names, names  # RoPE + append in the qkv GEMV
    m._m.rope_in_qkv = False
    print("\nPDL on cuda:", _C.llm.pdl_enabled("cuda"))


@cuda_only
def test_graph_nodes_per_level():
    # Kernels per decode step: level 2 needs fewer than level 1, which needs fewer than 0.
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=3)
    kernels = {}
    for level in (0, 1, 2):
        m._m.fusion = level
        g = _C.llm.Generation(m._m, PROMPTS, max_new_tokens=4, ignore_eos=True, cuda_graph=True)
        while not g.done:
            g.step()
        nodes = list(g.graph_nodes)
        print(f"\nfusion {level}: graph nodes {nodes} (all, kernels, memcpy, memset)")
        assert nodes[0] > 0 and nodes[1] > 0
        kernels[level] = nodes[1]
    m._m.fusion = 2
    assert kernels[2] < kernels[1] < kernels[0], kernels


# ---- project_qkv_rope: the q/k/v GEMV + rope_append in one launch ----

def qkv_rope_case(dtype, m, hq, hkv, D, bs, nb, device, rd=None, il=False, bias=False, bad=False, seed=0):
    rng = np.random.default_rng(seed)
    K = 64 * 3
    x = (rng.standard_normal((m, K))).astype(NP_DT[dtype])
    w = (rng.standard_normal(((hq + 2 * hkv) * D, K)) / math.sqrt(K)).astype(NP_DT[dtype])
    b = (rng.standard_normal(((hq + 2 * hkv) * D,)) * 0.1).astype(NP_DT[dtype]) if bias else None
    pos = rng.integers(0, 3 * bs, size=m).astype(np.int32)
    bt = rng.permutation(nb)[: m * 3].reshape(m, 3).astype(np.int32)
    if bad:
        bt[0, pos[0] // bs] = nb + 3  # token 0: page outside the pool, not stored
    caches = [np.full((nb, bs, hkv, D), 5, NP_DT[dtype]) for _ in range(4)]
    cs = [arr(c.copy(), device) for c in caches]
    dev = lambda a: arr(a, device) if a is not None else None
    q = _C.llm.fused_project_qkv_rope(dev(x), dev(w), dev(b), hq, cs[0], cs[1], dev(pos), dev(bt),
                                      rotary_dim=rd, interleaved=il)
    # the two-launch composition on the same device
    y = _C.llm.fused_project(dev(x), dev(w), dev(b))
    Q, KV = hq * D, hkv * D
    q2 = y[:, :Q].reshape((m, hq, D))
    k2 = y[:, Q:Q + KV].reshape((m, hkv, D))
    v2 = y[:, Q + KV:].reshape((m, hkv, D))
    _C.llm.fused_rope_append(q2, k2, v2, cs[2], cs[3], dev(pos), dev(bt), rotary_dim=rd, interleaved=il)
    return [gk.to_numpy(a) for a in (q, cs[0], cs[1])], [gk.to_numpy(a) for a in (q2, cs[2], cs[3])]


@pytest.mark.parametrize("il", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_project_qkv_rope_cpu(il, bias):
    one, two = qkv_rope_case("bfloat16", 3, 4, 2, 32, 16, 12, "cpu", il=il, bias=bias, bad=True)
    for a, b in zip(one, two):
        assert a.tobytes() == b.tobytes()


@cuda_only
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("shape", [(32, 8, 128, 16, 40, None), (4, 2, 64, 32, 30, None), (6, 2, 64, 16, 30, 32)])
@pytest.mark.parametrize("il", [False, True])
def test_project_qkv_rope_cuda(dtype, m, shape, il):
    hq, hkv, D, bs, nb, rd = shape
    one, two = qkv_rope_case(dtype, m, hq, hkv, D, bs, nb, "cuda", rd=rd, il=il, bias=m == 3, bad=m > 1)
    names = ("q", "k_cache", "v_cache")
    for n, a, b in zip(names, one, two):  # the same bits as project then rope_append
        if a.tobytes() != b.tobytes():
            d = np.argwhere(a.astype(np.float64) != b.astype(np.float64))
            raise AssertionError(f"{n}: {len(d)} values differ, first at {tuple(d[0])}: "
                                 f"{a[tuple(d[0])]} vs {b[tuple(d[0])]}")
    cpu, _ = qkv_rope_case(dtype, m, hq, hkv, D, bs, nb, "cpu", rd=rd, il=il, bias=m == 3, bad=m > 1)
    for n, a, b in zip(names, one, cpu):
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), atol=4 * EPS[dtype] * 4 + 1e-3,
                                   err_msg=n)


def test_project_qkv_rope_bad_input():
    x = arr(rand((1, 64), "bfloat16"))
    w = arr(rand(((4 + 4) * 16, 64), "bfloat16"))
    kc = arr(np.zeros((4, 16, 2, 16), NP_DT["bfloat16"]))
    pos, bt = arr(np.zeros(1, np.int32)), arr(np.zeros((1, 2), np.int32))
    with pytest.raises(ValueError, match="rows"):
        _C.llm.fused_project_qkv_rope(x, w, None, 5, kc, kc, pos, bt)
    with pytest.raises(ValueError, match="positions"):
        _C.llm.fused_project_qkv_rope(x, w, None, 4, kc, kc, arr(np.zeros(2, np.int32)), bt)
    with pytest.raises(TypeError):
        _C.llm.fused_project_qkv_rope(x, w, None, 4, arr(np.zeros((4, 16, 2, 16), np.float32)), kc, pos, bt)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA else []))
def test_rope_in_qkv_same_bits(device):
    dtype = "bfloat16" if device == "cuda" else "float32"
    m = gk.llm.random_model(CFG, device=device, dtype=dtype, seed=6)
    assert not m._m.rope_in_qkv and not m._m.norm_in_tail  # the defaults
    m._m.fused_attention_auto_hd64 = False  # (else the fused attention: rope_in_qkv not used)
    base = decode_logits(m, new=10)
    for rope_in_qkv, tail in ((True, True), (True, False), (False, True)):  # the same bits
        m._m.rope_in_qkv = rope_in_qkv
        m._m.norm_in_tail = tail
        got = decode_logits(m, new=10)
        assert base[0] == got[0], (rope_in_qkv, tail)
        for t, (a, b) in enumerate(zip(base[1], got[1])):
            assert a.tobytes() == b.tobytes(), f"step {t}: logits differ (rope_in_qkv {rope_in_qkv}, tail {tail})"


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA else []))
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("n,k", [(256, 64), (2048, 2048), (4096, 4096), (4104, 520)])
def test_project_norm_same_bits(device, m, n, k):
    # the add + RMSNorm in the projection's last block against project then add_rms_norm
    rng = np.random.default_rng(n + m)
    x = rng.standard_normal((m, k)).astype(NP_DT["bfloat16"])
    w = (rng.standard_normal((n, k)) / math.sqrt(k)).astype(NP_DT["bfloat16"])
    res = rng.standard_normal((m, n)).astype(NP_DT["bfloat16"])
    nw = (1 + 0.1 * rng.standard_normal(n)).astype(NP_DT["bfloat16"])
    d = lambda t: arr(t, device)
    y0 = _C.llm.fused_project(d(x), d(w))
    h0, r0 = _C.llm.fused_add_rms_norm(y0, d(res), d(nw), 1e-5)
    for _ in range(2):  # the counter is left at zero: a second call works the same
        y, h, r, ctr = _C.llm.fused_project_norm(d(x), d(w), d(res), d(nw), 1e-5)
        assert bits(y) == bits(y0) and bits(r) == bits(r0), "y or residual"
        assert bits(h) == bits(h0), f"norm: max |diff| {np.max(np.abs(f64(h) - f64(h0)))}"
        assert int(gk.to_numpy(ctr)[0]) == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("rows,I", [(1, 7), (3, 512), (8, 1000)])
def test_swiglu_matches_gated_fused(dtype, rows, I):
    gu = rand((rows, 2 * I), dtype)
    for d in ["cpu"] + (["cuda"] if CUDA else []):
        got = _C.llm.fused_swiglu(arr(gu, d))
        want = silu(f64(gu[:, :I])) * f64(gu[:, I:])
        np.testing.assert_allclose(f64(got), want, rtol=2 * EPS[dtype], atol=1e-6)
        ref = gk.nn.swiglu(arr(gu, d))  # gated_fused: the same rule
        np.testing.assert_allclose(f64(got), f64(ref), rtol=2 * EPS[dtype] + 1e-6, atol=1e-7)
