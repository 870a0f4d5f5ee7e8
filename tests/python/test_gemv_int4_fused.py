"""The staged int4 GEMV's norm / residual epilogues (session 13; k_w4 EPI 1 / 2 in src/cuda/common/gemv_w4.cuh,
gemv_quantized_norm / gemv_quantized_residual in include/gpukit/quant.h) and the engine option that uses them,
EngineOptions::quantized_norm_in_proj.

- residual (EPI 2): r = round(round(W x) + r) in place, and part[j] = sum of the new r^2 over rows 16 j .. 16 j + 15.
  The product is variant 48's (the default's) kernel and plan: r must equal the default GEMV's rounded output
  added to r in float32 and rounded (the engine's add_rms_norm residual), bit for bit.
- norm (EPI 1): y = W bf16(r * inv * w) with inv = rsqrt(sum(part) / K + eps). With partial sums that add up to
  K exactly and eps 0, inv is 1 and y must equal the default GEMV of bf16(r * w) bit for bit; with other partial
  sums, y is checked against float64 within the bf16 rounding of the normalized row.
- the engine: one sequence with int4 weights (groups of 128, K % 512 == 0) takes it (a step counter), graph
  replay = eager bits, logits near the separate norms' (the 1 / rms sum runs in another order); three
  sequences do not take it (the same bits as without the option).
CUDA parts skip without a GPU."""
import math

import numpy as np
import pytest

import gpukit as gk
from gpukit import _C

from test_llm_decode_s6 import run_p
from test_llm_step import CFG128, PROMPTS, same
from w4_ref import f64, same_bits, within

CUDA = gk.cuda.is_available()
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
RNG = np.random.default_rng(1313)
# (N, K) taking the epilogues (K % 512 == 0, no split-K): the 8B model's q/k/v, o, down and gate/up, odd N
SHAPES = [(6144, 4096), (4096, 4096), (4096, 14336), (28672, 4096), (1000, 1536), (37, 2048), (4099, 512)]


def bf16(a):
    """float32 values rounded to bfloat16 (round to nearest even), as float32."""
    return f64(gk.asarray(np.asarray(a, dtype=np.float32)).astype("bfloat16").astype("float32")).astype(np.float32)


def weight(n, k):
    w = (RNG.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
    q, s, z = gk.quantize_int4(gk.asarray(w), group=128)
    deq = f64(gk.dequantize_int4(q, s, z, group=128))
    return (q.to("cuda"), s.to("cuda"), z.to("cuda")), deq


def dev_bf16(a):
    return gk.asarray(np.asarray(a, dtype=np.float32)).astype("bfloat16").to("cuda")


def host(a):
    return f64(a.astype("float32")).astype(np.float32)


def default_gemv(qsz, x):
    q, s, z = qsz
    return host(gk.gemv_int4(x, q, s, z, group=128))


def poisoned_part(n):
    return gk.asarray(np.full((1, n), np.nan, dtype=np.float32)).to("cuda")


def test_fused_forms_cpu_errors():
    """Without CUDA arrays the fused forms raise a clear error; the applies query says no."""
    w = (RNG.standard_normal((64, 512)) / 20).astype(np.float32)
    q, s, z = gk.quantize_int4(gk.asarray(w), group=128)
    x = gk.asarray(RNG.standard_normal((1, 512)).astype(np.float32)).astype("bfloat16")
    assert _C._gemv_int4_fused_applies(q, s, z, x) is False
    nw = gk.asarray(np.ones(512, np.float32)).astype("bfloat16")
    part = gk.asarray(np.ones((1, 4), np.float32))
    with pytest.raises(ValueError, match="CUDA"):
        _C._gemv_int4_norm(q, s, z, x, nw, 1e-5, part)
    r = gk.asarray(np.zeros((1, 64), np.float32)).astype("bfloat16")
    with pytest.raises(ValueError, match="CUDA"):
        _C._gemv_int4_residual(q, s, z, x, r, part)


def test_option_default_cpu():
    m = gk.llm.random_model(CFG128, device="cpu", dtype="float32", seed=3)
    assert m._m.quantized_norm_in_proj is False, "quantized_norm_in_proj must be off by default"
    base = run_p(m, False, [PROMPTS[2]], new=3)
    m._m.quantized_norm_in_proj = True
    assert m._m.quantized_norm_in_proj is True
    same(base, run_p(m, False, [PROMPTS[2]], new=3), "CPU: quantized_norm_in_proj has no effect")
    assert m._m.quantized_nip_steps == 0


@cuda_only
@pytest.mark.parametrize("n,k", SHAPES)
def test_residual_epilogue(n, k):
    qsz, deq = weight(n, k)
    x = dev_bf16(RNG.standard_normal((1, k)))
    assert _C._gemv_int4_fused_applies(*qsz, x), f"({n}, {k}) should take the epilogues"
    r0 = bf16(RNG.standard_normal((1, n)) * 0.5)
    want = bf16(default_gemv(qsz, x) + r0)  # the engine's residual: round(round(y) + r)
    np_ = (n + 15) // 16
    outs = []
    for _ in range(2):
        r = dev_bf16(r0)
        part = poisoned_part(np_)
        _C._gemv_int4_residual(*qsz, x, r, part)
        got = host(r)
        same_bits(f"({n}, {k}) residual", got, want)
        sums = np.array([np.sum(want[0, 16 * j:16 * j + 16].astype(np.float64) ** 2) for j in range(np_)])
        p = f64(part)[0]
        assert np.all(np.isfinite(p)), "partial sums left unwritten"
        within(f"({n}, {k}) partial sums", p, sums, 1e-6 * sums + 1e-30)
        outs.append((got.tobytes(), p.tobytes()))
    assert outs[0] == outs[1], "run to run"


@cuda_only
@pytest.mark.parametrize("n,k", SHAPES)
def test_norm_epilogue_unit_inv_same_bits(n, k):
    """Partial sums adding up to K exactly, eps 0: inv = 1, so x = bf16(r * w) and the default's bits."""
    qsz, _ = weight(n, k)
    r = bf16(RNG.standard_normal((1, k)))
    w = bf16(1.0 + 0.5 * RNG.standard_normal(k))
    npart = 256 if k % 256 == 0 else 1
    part = gk.asarray(np.full((1, npart), k / npart, dtype=np.float32)).to("cuda")
    got = host(_C._gemv_int4_norm(*qsz, dev_bf16(r), dev_bf16(w), 0.0, part))
    want = default_gemv(qsz, dev_bf16(bf16(r * w)))
    same_bits(f"({n}, {k}) norm, inv 1", got, want)


@cuda_only
@pytest.mark.parametrize("n,k", SHAPES)
def test_norm_epilogue_float64(n, k):
    qsz, deq = weight(n, k)
    r = bf16(RNG.standard_normal((1, k)) * 3.0)
    w = bf16(1.0 + 0.5 * RNG.standard_normal(k))
    eps = 1e-5
    npart = 256
    pv = RNG.uniform(0.5, 2.0, (1, npart)).astype(np.float32) * np.float32(k / npart)
    got = f64(_C._gemv_int4_norm(*qsz, dev_bf16(r), dev_bf16(w), eps, gk.asarray(pv).to("cuda")).astype("float32"))
    inv = 1.0 / math.sqrt(np.sum(pv.astype(np.float64)) / k + eps)
    x64 = r.astype(np.float64) * inv * w.astype(np.float64)
    ref = x64 @ deq.T
    # x rounded to bf16 (2^-8 relative per element, inv's own error 2^-21), the output rounded to bf16, the sums
    tol = 2.0**-8 * (np.abs(x64) @ np.abs(deq).T) * 1.01 + 2.0**-8 * np.abs(ref) + 1e-6
    within(f"({n}, {k}) norm", got, ref, tol)
    again = f64(_C._gemv_int4_norm(*qsz, dev_bf16(r), dev_bf16(w), eps, gk.asarray(pv).to("cuda")).astype("float32"))
    same_bits(f"({n}, {k}) norm run to run", got, again)


@cuda_only
def test_chain_residual_then_norm():
    """The engine's order: o's residual epilogue writes r and its partials, gate/up normalizes with them; against
    the separate add + RMSNorm in float64."""
    h, n2 = 1024, 3072
    qo, deqo = weight(h, 1536)
    qg, deqg = weight(n2, h)
    x = dev_bf16(RNG.standard_normal((1, 1536)))
    r0 = bf16(RNG.standard_normal((1, h)))
    w = bf16(1.0 + 0.25 * RNG.standard_normal(h))
    r = dev_bf16(r0)
    part = poisoned_part(h // 16)
    _C._gemv_int4_residual(*qo, x, r, part)
    y = f64(_C._gemv_int4_norm(*qg, r, dev_bf16(w), 1e-5, part).astype("float32"))
    rn = host(r).astype(np.float64)
    x64 = rn / np.sqrt(np.mean(rn**2) + 1e-5) * w
    ref = x64 @ deqg.T
    tol = 2.0**-8 * (np.abs(x64) @ np.abs(deqg).T) * 1.01 + 2.0**-8 * np.abs(ref) + 1e-6
    within("chain", y, ref, tol)


@cuda_only
def test_bad_input():
    qsz, _ = weight(256, 1024)
    x = dev_bf16(RNG.standard_normal((1, 1024)))
    w = dev_bf16(np.ones(1024))
    part = gk.asarray(np.ones((1, 64), np.float32)).to("cuda")
    with pytest.raises(TypeError, match="part"):
        _C._gemv_int4_norm(*qsz, x, w, 1e-5, part.astype("bfloat16"))
    with pytest.raises(ValueError, match="r"):
        _C._gemv_int4_norm(*qsz, dev_bf16(np.ones((1, 1000))), w, 1e-5, part)
    with pytest.raises(ValueError, match="norm_w"):
        _C._gemv_int4_norm(*qsz, x, dev_bf16(np.ones(999)), 1e-5, part)
    with pytest.raises(ValueError, match="eps"):
        _C._gemv_int4_norm(*qsz, x, w, -1.0, part)
    r = dev_bf16(np.zeros((1, 256)))
    with pytest.raises(ValueError, match="part"):
        _C._gemv_int4_residual(*qsz, x, r, gk.asarray(np.ones((1, 15), np.float32)).to("cuda"))
    with pytest.raises(ValueError, match="r"):
        _C._gemv_int4_residual(*qsz, x, dev_bf16(np.zeros((1, 255))), gk.asarray(np.ones((1, 16), np.float32)).to("cuda"))
    # K % 512 != 0: the wide meta copies do not apply
    qn, _ = weight(256, 384)
    x384 = dev_bf16(np.ones((1, 384)))
    assert _C._gemv_int4_fused_applies(*qn, x384) is False
    with pytest.raises(ValueError, match="qw"):
        _C._gemv_int4_norm(*qn, x384, dev_bf16(np.ones(384)), 1e-5, part)


# hidden 512, intermediate 1536: every int4 GEMV of the layer has K % 512 == 0 (groups of 128)
CFG_NIP = dict(CFG128, hidden_size=512, intermediate_size=1536, num_hidden_layers=3)


@cuda_only
@pytest.mark.parametrize("graph", [True, False])
def test_engine_one_sequence(graph):
    m = gk.llm.random_model(CFG_NIP, device="cuda", dtype="bfloat16", seed=131, quantize="int4")
    prompts = [PROMPTS[2]]
    base = run_p(m, graph, prompts, new=24)
    m._m.quantized_norm_in_proj = True
    s0 = m._m.quantized_nip_steps
    got = run_p(m, graph, prompts, new=24)
    assert m._m.quantized_nip_steps > s0, "quantized_norm_in_proj was not taken"
    other = run_p(m, not graph, prompts, new=24)
    same(got, other, "quantized_norm_in_proj: graph replay vs eager")
    same(got, run_p(m, graph, prompts, new=24), "quantized_norm_in_proj: run to run")
    # the norms' 1 / rms in another order: logits at rounding level of the separate norms'
    for t in range(3):
        a, b = base[1][t], got[1][t]
        scale = float(np.max(np.abs(a)))
        assert float(np.max(np.abs(a - b))) <= 0.02 * scale + 1e-3, f"step {t}: logits differ by {np.max(np.abs(a - b))}"
    agree = sum(x == y for x, y in zip(base[0], got[0]))
    print(f"\nqnip: {agree} of {len(base[0])} steps with the same tokens; steps {m._m.quantized_nip_steps - s0}")
    m._m.quantized_norm_in_proj = False


@cuda_only
def test_engine_three_sequences_unchanged():
    m = gk.llm.random_model(CFG_NIP, device="cuda", dtype="bfloat16", seed=132, quantize="int4")
    base = run_p(m, True, PROMPTS, new=12)
    m._m.quantized_norm_in_proj = True
    s0 = m._m.quantized_nip_steps
    same(base, run_p(m, True, PROMPTS, new=12), "three sequences: the option is not taken")
    assert m._m.quantized_nip_steps == s0
