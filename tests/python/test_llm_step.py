"""The engine's step kernels of src/cuda/llm_step.cu (src/llm/fused_step.cpp) and the
options around the decode step: embedding + first RMSNorm in one launch (against
float64 NumPy, and the same bits as add_rms_norm with a zero residual on CUDA), the
projection with float32 output (the lm head), the quantized prefill GEMM (the weight
expanded to bf16 + cuBLASLt, against the exact dequantization), the L2 prefetch side
branch (same bits with and without, graph and eager), and the engine options
head_proj / embed_norm / dequant_prefill. CUDA parts skip without a GPU."""
import math

import numpy as np
import pytest

import gpukit as gk
from gpukit import _C

from test_gemv import NP_DT, f64

CUDA = gk.cuda.is_available()
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
RNG = np.random.default_rng(23)


def arr(x, device="cpu"):
    a = gk.asarray(x)
    return a.to(device) if device != "cpu" else a


def np_of(a):
    return np.asarray(gk.to_numpy(a))


def first_bad(got, ref, tol):
    bad = np.argwhere(~(np.abs(got - ref) <= tol))
    if bad.size == 0:
        return None
    i = tuple(bad[0])
    return (f"{len(bad)} of {got.size} outside the tolerance, first at {i}: got {got[i]!r}, ref {ref[i]!r}, "
            f"max |diff| {float(np.max(np.abs(got - ref))):.3g}")


# ---- embed_norm ----

def ref_embed_norm(ids, table, w, eps):
    t = f64(table)
    x = np.stack([t[i] if 0 <= i < t.shape[0] else np.zeros(t.shape[1]) for i in ids])
    inv = 1.0 / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps)
    return x * inv * f64(w)[None, :], x


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA else []))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("H", [64, 136, 2048, 4096, 8192])
def test_embed_norm(device, dtype, H):
    V = 37
    table = (RNG.standard_normal((V, H)) * 2).astype(NP_DT[dtype])
    w = (1 + 0.2 * RNG.standard_normal(H)).astype(NP_DT[dtype])
    ids = np.array([3, 0, 36, 37, -1, 3, 12], np.int32)  # 37 and -1: outside the table -> zero rows
    h, x = _C.llm.fused_embed_norm(arr(ids, device), arr(table, device), arr(w, device), 1e-5)
    rh, rx = ref_embed_norm(ids, table, w, 1e-5)
    assert np.array_equal(f64(np_of(x)), rx), "the gathered rows are not copies of the table rows"
    eps = 2.0**-8 if dtype == "bfloat16" else 2.0**-11
    msg = first_bad(f64(np_of(h)), rh, 2 * eps * (np.abs(rh) + 1e-3))
    assert msg is None, msg
    assert not np.any(f64(np_of(h))[[3, 4]]), "zero rows for ids outside the table"
    if device == "cuda":  # the sums of add_rms_norm: the same bits with a zero residual
        xs = np_of(x)
        h2, _ = _C.llm.fused_add_rms_norm(arr(xs, device), arr(np.zeros_like(xs), device), arr(w, device), 1e-5)
        assert np_of(h).tobytes() == np_of(h2).tobytes(), "embed_norm differs from add_rms_norm(x, 0)"


def test_embed_norm_bad_input():
    t = arr(np.zeros((4, 8), np.float32))
    w = arr(np.ones(8, np.float32))
    with pytest.raises(ValueError, match="ids"):
        _C.llm.fused_embed_norm(arr(np.zeros(2, np.int64)), t, w)
    with pytest.raises(ValueError):
        _C.llm.fused_embed_norm(arr(np.zeros(2, np.int32)), t, arr(np.ones(7, np.float32)))
    with pytest.raises(ValueError, match="eps"):
        _C.llm.fused_embed_norm(arr(np.zeros(2, np.int32)), t, w, float("nan"))


# ---- project with float32 output ----

@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA else []))
@pytest.mark.parametrize("m,k,n", [(1, 64, 40), (3, 200, 33), (8, 512, 129)])
@pytest.mark.parametrize("bias", [False, True])
def test_project_out_f32(device, m, k, n, bias):
    x = RNG.standard_normal((m, k)).astype(NP_DT["bfloat16"])
    w = (RNG.standard_normal((n, k)) / math.sqrt(k)).astype(NP_DT["bfloat16"])
    b = (RNG.standard_normal(n) * 0.1).astype(NP_DT["bfloat16"]) if bias else None
    y = _C.llm.fused_project(arr(x, device), arr(w, device), arr(b, device) if bias else None, out_f32=True)
    assert np_of(y).dtype == np.float32
    got = f64(np_of(y))
    ref = f64(x) @ f64(w).T + (f64(b) if bias else 0)
    tol = (k + 4) * 2.0**-23 * (np.abs(f64(x)) @ np.abs(f64(w)).T + 1)
    msg = first_bad(got, ref, tol)
    assert msg is None, msg
    if device == "cuda":  # the bf16 projection is this result rounded (without bias)
        if not bias:
            yb = _C.llm.fused_project(arr(x, device), arr(w, device))
            assert np.array_equal(f64(np_of(yb)), f64(got.astype(np.float32).astype(NP_DT["bfloat16"])))
        y2 = _C.llm.fused_project(arr(x, device), arr(w, device), arr(b, device) if bias else None, out_f32=True)
        assert np_of(y).tobytes() == np_of(y2).tobytes()
    with pytest.raises(ValueError):
        _C.llm.fused_project(arr(x, device), arr(np.concatenate([w, w]), device), swiglu=True, out_f32=True)


# ---- quantized prefill GEMM ----

def quantized(fmt, w, group=128):
    if fmt == "int4":
        q, s, z = gk.quantize_int4(w, group=group)
        return q, s, z, f64(gk.dequantize_int4(q, s, z, group=group))
    q, s = getattr(gk, f"quantize_{fmt}")(w)
    return q, s, None, f64(getattr(gk, f"dequantize_{fmt}")(q, s))


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4"])
@pytest.mark.parametrize("m,k,n,group", [(9, 256, 72, 128), (130, 384, 200, 64), (33, 4096, 264, 32)])
@pytest.mark.parametrize("out", ["bfloat16", "float32"])
def test_dequant_linear(fmt, m, k, n, group, out):
    w = (RNG.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
    x = RNG.standard_normal((m, k)).astype(NP_DT["bfloat16"])
    q, s, z, deq = quantized(fmt, gk.asarray(w).to("cuda"), group)
    y = _C.llm.fused_dequant_linear(arr(x, "cuda"), q, s, z, fmt, group if fmt == "int4" else 0, out)
    got = f64(np_of(y))
    ref = f64(x) @ deq.T
    # int4: each weight rounded to bf16 once (2^-9 relative); the output rounded to out
    mag = np.abs(f64(x)) @ np.abs(deq).T
    tol = (2.0**-8 if fmt == "int4" else k * 2.0**-22) * mag + (2.0**-8 if out == "bfloat16" else 2.0**-22) * (
        np.abs(ref) + 1e-6)
    msg = first_bad(got, ref, tol)
    assert msg is None, f"{fmt} m={m} k={k} n={n}: {msg}"
    y2 = _C.llm.fused_dequant_linear(arr(x, "cuda"), q, s, z, fmt, group if fmt == "int4" else 0, out)
    assert np_of(y).tobytes() == np_of(y2).tobytes(), "not the same bits twice"


@cuda_only
def test_dequant_linear_unhandled():
    x = arr(RNG.standard_normal((9, 64)).astype(np.float32), "cuda")  # float32 x: not handled
    q, s = gk.quantize_fp8(gk.asarray(RNG.standard_normal((8, 64)).astype(np.float32)).to("cuda"))
    with pytest.raises(ValueError, match="not handled"):
        _C.llm.fused_dequant_linear(x, q, s, None, "fp8")


# ---- the engine's options ----

CFG = dict(model_type="llama", vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
           rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
PROMPTS = [[(i * 37 + 11) % 512 for i in range(n)] for n in (5, 14, 30)]
CFG128 = dict(CFG, hidden_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=128)


def run(m, graph, new=12):
    g = _C.llm.Generation(m._m, PROMPTS, max_new_tokens=new, ignore_eos=True, cuda_graph=graph, lookahead=False)
    steps, logits = [], []
    while not g.done:
        steps.append(list(g.step()))
        logits.append(np_of(g.last_logits()).astype(np.float32))
    return steps, logits


def same(a, b, what):
    assert a[0] == b[0], f"{what}: tokens differ"
    for t, (x, y) in enumerate(zip(a[1], b[1])):
        assert x.tobytes() == y.tobytes(), f"{what}: step {t} logits differ (max {np.max(np.abs(x - y)):.3g})"


@cuda_only
@pytest.mark.parametrize("quantize", [None, "fp8", "int4"])
def test_prefetch_same_bits(quantize):
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=5, quantize=quantize)
    m._m.prefetch_mb = 0
    ref = run(m, True)
    for mb, last in ((1, False), (64, True)):
        m._m.prefetch_mb = mb
        m._m.prefetch_last = last
        same(ref, run(m, True), f"graph, prefetch {mb} MiB")
        same(ref, run(m, False), f"eager, prefetch {mb} MiB")
    with pytest.raises(ValueError):
        m._m.prefetch_mb = -1


@cuda_only
def test_head_proj_and_embed_norm():
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=6)
    base = run(m, True)
    for attr in ("head_proj", "embed_norm"):
        old = getattr(m._m, attr)
        setattr(m._m, attr, not old)
        alt = run(m, True)
        same(alt, run(m, False), f"{attr}={not old}: graph vs eager")
        for t, (x, y) in enumerate(zip(base[1], alt[1])):
            if base[0][:t] != alt[0][:t]:
                break  # a different token earlier: later logits are another sequence
            rel = float(np.max(np.abs(x - y)) / np.max(np.abs(x)))
            assert rel < 3e-2, f"{attr}: step {t} max rel diff {rel:.3g}"
        setattr(m._m, attr, old)


@cuda_only
@pytest.mark.parametrize("quantize", ["fp8", "int8", "int4"])
def test_dequant_prefill_close_to_gemv(quantize):
    ids = [(i * 53 + 7) % 512 for i in range(40)]
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=4, quantize=quantize)
    assert m._m.dequant_prefill
    a = f64(np_of(m.forward(ids)))
    m._m.dequant_prefill = False
    b = f64(np_of(m.forward(ids)))
    rel = float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
    print(f"\n{quantize}: prefill logits, dequantized GEMM vs GEMV per 8 rows: max rel diff {rel:.4f}")
    assert rel < 3e-2


# ---- the lm head's format (quantize="<format>:head=<format>") ----

@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA else []))
def test_quantize_head_format(device):
    dtype = "float32" if device == "cpu" else "bfloat16"
    ids = [(i * 53 + 7) % 512 for i in range(20)]
    models = {q: gk.llm.random_model(CFG, device=device, dtype=dtype, seed=8, quantize=q)
              for q in ("int4", "int4:head=int4", "int4:head=none", "fp8:head=int8")}
    nb = {q: m._m.nbytes for q, m in models.items()}
    assert nb["int4:head=int4"] < nb["int4"] < nb["int4:head=none"], nb
    assert all(m.quantized in ("int4", "fp8") for m in models.values())
    ref = f64(np_of(models["int4:head=none"].forward(ids)))
    for q in ("int4", "int4:head=int4"):
        got = f64(np_of(models[q].forward(ids)))
        rel = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
        print(f"\n{device} {q}: logits vs the unquantized head: max rel diff {rel:.4f}")
        assert 0 < rel < 0.2, rel
    for bad in ("int4:head=int2", "int4:tail=int4", ":head=int4", "int3"):
        with pytest.raises(ValueError, match="quantize"):
            gk.llm.random_model(CFG, device=device, dtype=dtype, quantize=bad)


# ---- the greedy token folded into the lm head ----

@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA else []))
@pytest.mark.parametrize("m,k,n", [(1, 64, 1000), (3, 136, 517), (8, 256, 4099)])
def test_project_argmax_keys(device, m, k, n):
    x = RNG.standard_normal((m, k)).astype(NP_DT["bfloat16"])
    w = (RNG.standard_normal((n, k)) / math.sqrt(k)).astype(NP_DT["bfloat16"])
    w[n // 2] = w[n // 3]  # equal logits in every row: the lower index wins if they are the max
    w[n - 1] = w[n // 3]
    x[0] = 0  # row 0: every logit +0 (zero products): token 0
    keys = arr(np.zeros(m, np.int64), device)
    y = _C.llm.fused_project(arr(x, device), arr(w, device), out_f32=True, argmax_keys=keys)
    logits = np_of(y)
    state = arr(np.array([[5] * m, [10] * m, [11] * m], np.int32), device)
    tok = np_of(_C.llm.fused_advance_argmax(state, keys))
    expect = np.argmax(logits, axis=1)  # first maximum
    assert tok.tolist() == expect.tolist(), (tok, expect)
    assert tok[0] == 0
    assert not np_of(keys).any(), "keys not reset"
    st = np_of(state)
    assert st[0].tolist() == tok.tolist() and (st[1] == 11).all() and (st[2] == 12).all()
    # forcing the tie: the duplicated rows hold the max of row 1 if they are made large
    w[n // 3] = w[n // 2] = w[n - 1] = np.abs(w[n // 3]) * 4
    x2 = np.abs(x).astype(NP_DT["bfloat16"])
    y = _C.llm.fused_project(arr(x2, device), arr(w, device), out_f32=True, argmax_keys=keys)
    tok = np_of(_C.llm.fused_advance_argmax(state, keys))
    assert tok.tolist() == np.argmax(np_of(y), axis=1).tolist()
    if m > 1:
        assert tok[1] == n // 3


@cuda_only
def test_head_argmax_engine():
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=12)
    m._m.head_proj = True
    for graph in (True, False):
        steps, logits = run(m, graph, new=16)
        for t, (tok, lg) in enumerate(zip(steps, logits)):
            assert tok == np.argmax(lg, axis=1).tolist(), f"step {t}: {tok} vs argmax of the logits"
    m._m.head_proj = False


# ---- the norm inside the projection, the residual in its epilogue ----

def rnd(v, dtype):
    return np.asarray(v, np.float64).astype(NP_DT[dtype]).astype(np.float64)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA else []))
@pytest.mark.parametrize("m,k,n", [(1, 256, 40), (3, 520, 33), (8, 4096, 72)])
@pytest.mark.parametrize("mode", ["plain", "swiglu", "f32"])
def test_project_norm_in(device, m, k, n, mode):
    dtype = "bfloat16"
    r = (RNG.standard_normal((m, k)) * 3).astype(NP_DT[dtype])
    nw = (1 + 0.3 * RNG.standard_normal(k)).astype(NP_DT[dtype])
    w = (RNG.standard_normal((2 * n if mode == "swiglu" else n, k)) / math.sqrt(k)).astype(NP_DT[dtype])
    y = _C.llm.fused_project_opts(arr(r, device), arr(w, device), swiglu=mode == "swiglu", norm_w=arr(nw, device),
                                  norm_eps=1e-5, out_f32=mode == "f32")
    rr = f64(r)
    hn = rr / np.sqrt(np.mean(rr * rr, axis=1, keepdims=True) + 1e-5) * f64(nw)[None, :]
    z = hn @ f64(w).T
    if mode == "swiglu":
        g, u = rnd(z[:, :n], dtype), rnd(z[:, n:], dtype)
        ref = g / (1 + np.exp(-g)) * u
    else:
        ref = z
    got = f64(np_of(y))
    mag = np.abs(hn) @ np.abs(f64(w)).T
    mag = mag[:, :n] + (mag[:, n:] if mode == "swiglu" else 0)
    tol = (2.0**-8 if mode != "f32" else 0) * np.abs(ref) + (k + 8) * 2.0**-23 * (mag + 1) * (3 if mode == "swiglu" else 1)
    if mode == "swiglu":
        tol = tol + 2.0**-7 * (np.abs(ref) + 1e-2)
    msg = first_bad(got, ref, tol)
    assert msg is None, msg
    if device == "cuda":
        y2 = _C.llm.fused_project_opts(arr(r, device), arr(w, device), swiglu=mode == "swiglu",
                                       norm_w=arr(nw, device), norm_eps=1e-5, out_f32=mode == "f32")
        assert np_of(y).tobytes() == np_of(y2).tobytes()
        if m > 1:  # a row's bits do not depend on the other rows
            y1 = _C.llm.fused_project_opts(arr(r[1:2], device), arr(w, device), swiglu=mode == "swiglu",
                                           norm_w=arr(nw, device), norm_eps=1e-5, out_f32=mode == "f32")
            assert np_of(y)[1:2].tobytes() == np_of(y1).tobytes()


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA else []))
def test_project_residual_epilogue(device):
    dtype = "bfloat16"
    m, k, n = 3, 512, 96
    x = RNG.standard_normal((m, k)).astype(NP_DT[dtype])
    w = (RNG.standard_normal((n, k)) / math.sqrt(k)).astype(NP_DT[dtype])
    res = (RNG.standard_normal((m, n)) * 4).astype(NP_DT[dtype])
    y = np_of(_C.llm.fused_project_opts(arr(x, device), arr(w, device), residual=arr(res, device)))
    plain = np_of(_C.llm.fused_project(arr(x, device), arr(w, device)))
    expect = (f64(plain) + f64(res)).astype(np.float32).astype(NP_DT[dtype])  # add_rms_norm's residual rule
    assert y.tobytes() == expect.tobytes()
    with pytest.raises(ValueError, match="residual"):
        _C.llm.fused_project_opts(arr(x, device), arr(w, device), residual=arr(res[:, :5], device))
    with pytest.raises(ValueError, match="norm_w"):
        _C.llm.fused_project_opts(arr(x, device), arr(w, device), norm_w=arr(np.ones(k - 1, NP_DT[dtype]), device))


@cuda_only
@pytest.mark.parametrize("fa,hp", [(False, False), (True, True)])
def test_norm_in_proj_engine(fa, hp):
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=13)
    base = run(m, True, new=16)
    m._m.norm_in_proj = True
    m._m.fused_attention = fa
    m._m.head_proj = hp
    alt = run(m, True, new=16)
    same(alt, run(m, False, new=16), "norm_in_proj: graph vs eager")
    for t, (x, y) in enumerate(zip(base[1], alt[1])):
        if base[0][:t] != alt[0][:t]:
            break
        rel = float(np.max(np.abs(x - y)) / np.max(np.abs(x)))
        assert rel < 3e-2, f"step {t} max rel diff {rel:.3g}"
    if hp:
        for t, (tok, lg) in enumerate(zip(*alt)):
            assert tok == np.argmax(lg, axis=1).tolist(), f"step {t}"


@cuda_only
def test_no_copy_kernels_in_the_b1_step():
    # The attention output of one sequence reshaped to [1, Q] (a size-1 dim with any
    # stride) goes to the o GEMV without an aligning copy: with the fused attention a
    # layer is 7 kernels (q/k/v, attention, o, add + norm, gate/up + SwiGLU, down, add +
    # norm) at B=1 and B=2. Per-layer counts from 2- and 4-layer models, so that launches
    # outside the layers (lm head, argmax: other areas' kernels, whose count may depend on
    # B) do not count.
    per_layer = {}
    for B in (1, 2):
        n = {}
        for layers in (2, 4):
            m = gk.llm.random_model(dict(CFG, num_hidden_layers=layers), device="cuda", dtype="bfloat16", seed=3)
            m._m.fused_attention = True
            g = _C.llm.Generation(m._m, PROMPTS[:B], max_new_tokens=3, ignore_eos=True, cuda_graph=True)
            while not g.done:
                g.step()
            n[layers] = list(g.graph_nodes)
            assert m._m.fused_attention_layers > 0, "the fused attention was not taken"
            assert n[layers][2] == 0, f"memcpy nodes in the step: {n[layers]}"
        per_layer[B] = (n[4][1] - n[2][1]) / 2
        print(f"\nB={B}: graph nodes (all, kernels, memcpy, memset) of 2 / 4 layers: {n[2]} / {n[4]}")
    assert per_layer[1] == per_layer[2] == 7, f"kernels per layer by batch: {per_layer}"


@cuda_only
@pytest.mark.parametrize("quantize", [None, "int4"])
@pytest.mark.parametrize("fa", [False, True])
def test_attn_l2_same_bits(quantize, fa):
    # The o weight brought into L2 by rope_append / the fused attention changes no bits.
    # attn_l2 3 / 4: the fused attention issues the prefetch after its K/V have landed
    # (rope_append: as 1 / 2). fa False: rope_append + attention_decode (auto_hd64 off).
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=9, quantize=quantize)
    m._m.fused_attention = fa
    m._m.fused_attention_auto_hd64 = fa
    n0 = m._m.fused_attention_layers
    ref = run(m, True)
    assert (m._m.fused_attention_layers > n0) == fa, "the fused attention taken or not as asked"
    for v in (1, 2, 3, 4):
        m._m.attn_l2 = v
        same(ref, run(m, True), f"attn_l2={v}, graph")
        same(ref, run(m, False), f"attn_l2={v}, eager")
    m._m.attn_l2 = 0


@cuda_only
@pytest.mark.parametrize("cfg", ["64", "128"])
def test_kv_l2_same_bits(cfg):
    # The KV pages brought into L2 by the q/k/v GEMV's last blocks change no bits (with
    # head_dim 128 the fused attention reads them, with 64 rope_append + attention_decode).
    m = gk.llm.random_model(CFG if cfg == "64" else CFG128, device="cuda", dtype="bfloat16", seed=13)
    assert not m._m.kv_l2
    ref = run(m, True, new=20)
    m._m.kv_l2 = True
    same(ref, run(m, True, new=20), "kv_l2, graph")
    same(ref, run(m, False, new=20), "kv_l2, eager")
    m._m.kv_l2 = False


@cuda_only
def test_quantized_pdl_off_same_bits():
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=5, quantize="int4")
    assert not m._m.quantized_pdl  # off by default (checkpoint A of session 5)
    m._m.quantized_pdl = True
    ref = run(m, True)
    m._m.quantized_pdl = False
    same(ref, run(m, True), "quantized_pdl off, graph")
    same(ref, run(m, False), "quantized_pdl off, eager")
    m._m.quantized_pdl = True
    # compact: small SwiGLU / rope_append grids (grid-stride), the fused attention without PDL
    m._m.quantized_pdl_compact = True
    same(ref, run(m, True), "quantized_pdl_compact, graph")
    same(ref, run(m, False), "quantized_pdl_compact, eager")
    m._m.fused_attention = True
    fa_ref = run(m, False)
    m._m.quantized_pdl_compact = False
    same(fa_ref, run(m, True), "fused attention, quantized_pdl_compact vs not")
    m._m.fused_attention = False
    m._m.quantized_pdl = False
