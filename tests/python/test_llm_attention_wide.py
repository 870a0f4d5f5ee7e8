"""Session 8 (branch attne10): EngineOptions::fused_attention_wide.

The fused decode attention (src/cuda/llm_attention_kernel.cuh, template parameter WM; MMA
passes, chunks of 64 / 128 keys; kernels in src/cuda/llm_attention_wide.cu) with 2 or 4 times
the warps per CTA. Every sum keeps its order (a key's score is one tensor-core sum whichever
warp computes it; the softmax stays one warp per head; P V keeps its (column, key group)
threads, the copies taking different heads; the merges loop over the same elements with more
threads), so the same bits as without the option: every test compares bit for bit (tokens and
logits) with the option off, over the merges (pull / push cluster merge, workspace merge),
both chunk sizes, head_dim 64 / 128, 2, 3, 4 and 8 query heads per kv head, bf16 / fp16 and
fp8 / int4 weights, graph and eager, three sequences of different lengths (keyless chunks)
and a longer one (5 chunks of 64 keys). That the wide kernels ran is read from the engine's
counter fused_attention_wide_layers. CUDA parts skip without a GPU."""
import numpy as np
import pytest

import gpukit as gk
from gpukit import _C

from test_llm_decode_s6 import fa_on, run_p
from test_llm_step import CFG, CFG128, PROMPTS, arr, cuda_only, np_of, same

NEW = 110  # up to 30 + 110 tokens: two 128-key chunks / three 64-key chunks in the last steps
# query heads per kv head: CFG 2; these 3 (head_dim 128), 4 and 8 (head_dim 64; the 8B has 4)
CFG_G3 = dict(CFG128, hidden_size=768, num_attention_heads=6, num_key_value_heads=2)
CFG_G4 = dict(CFG, hidden_size=512, num_attention_heads=8, num_key_value_heads=2)
CFG_G8 = dict(CFG, hidden_size=512, num_attention_heads=8, num_key_value_heads=1)
LONG = [[(i * 53 + 7) % 512 for i in range(230)]]  # + 60 new: up to 290 keys, 5 chunks of 64


def counters(m):
    return m._m.fused_attention_layers, m._m.fused_attention_push_layers, m._m.fused_attention_wide_layers


def test_wide_option_cpu():
    m = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)
    assert m._m.fused_attention_wide == -1, "fused_attention_wide is -1 (by format and grid) since session 16"
    m._m.fused_attention_wide = 0
    base = run_p(m, False, PROMPTS, new=3)
    for w in (2, 4, -1, 0):
        m._m.fused_attention_wide = w
        assert m._m.fused_attention_wide == w
    for bad in (1, 3, 8, -2):
        with pytest.raises(ValueError):
            m._m.fused_attention_wide = bad
    assert m._m.fused_attention_wide == 0
    m._m.fused_attention_wide = 4
    same(base, run_p(m, False, PROMPTS, new=3), "CPU: fused_attention_wide has no effect")
    assert counters(m)[2] == 0 and m._m.fused_attention_wide4_layers == 0


def test_wide_env_cpu(monkeypatch):
    # GPUKIT_FUSED_ATTN_WIDE sets the default of new models; other values are an error
    monkeypatch.setenv("GPUKIT_FUSED_ATTN_WIDE", "2")
    assert gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)._m.fused_attention_wide == 2
    monkeypatch.setenv("GPUKIT_FUSED_ATTN_WIDE", "-1")
    assert gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)._m.fused_attention_wide == -1
    monkeypatch.setenv("GPUKIT_FUSED_ATTN_WIDE", "3")
    with pytest.raises(ValueError, match="GPUKIT_FUSED_ATTN_WIDE"):
        gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)


def check_same_bits(m, what, wides=(2, 4), push_expected=None, prompts=PROMPTS, new=NEW, eager=True,
                    taken=True):
    m._m.fused_attention_wide = 0
    base = run_p(m, True, prompts, new=new)
    f0, p0, w0 = counters(m)
    assert w0 == 0, f"{what}: wide layers counted with the option off"
    for w in wides:
        m._m.fused_attention_wide = w
        f1, p1, w1 = counters(m)
        same(base, run_p(m, True, prompts, new=new), f"{what}: wide {w}, graph")
        if eager:
            same(base, run_p(m, False, prompts, new=new), f"{what}: wide {w}, eager")
        f2, p2, w2 = counters(m)
        assert f2 > f1, f"{what}: the fused attention was not taken (layers {f1} -> {f2})"
        if taken:
            assert w2 - w1 == f2 - f1, f"{what}: wide {w}: {w2 - w1} of {f2 - f1} fused attention layers wide"
        else:
            assert w2 == w1, f"{what}: wide {w} taken where it should be ignored ({w1} -> {w2})"
        if push_expected is not None:
            assert (p2 > p1) == push_expected, f"{what}: push layers {p1} -> {p2}, push expected {push_expected}"
        print(f"\n{what}: wide {w} same bits ({f2 - f1} fused attention layers, {w2 - w1} wide, {p2 - p1} push)")
    m._m.fused_attention_wide = 0


def bf16_model(cfg, seed, chunk=None, push=None, cluster=None):
    m = fa_on(gk.llm.random_model(cfg, device="cuda", dtype="bfloat16", seed=seed))
    if chunk is not None:
        m._m.fused_attention_chunk = chunk
    if push is not None:
        m._m.fused_attention_push = push
        m._m.fused_attention_push_auto = False
    if cluster is not None:
        m._m.fused_attention_cluster = cluster
    return m


@cuda_only
@pytest.mark.parametrize("chunk,push,cluster", [(128, False, True), (128, True, True), (64, False, True),
                                                (64, True, True), (128, False, False), (64, False, False)])
def test_wide_same_bits_bf16_hd128(chunk, push, cluster):
    m = bf16_model(CFG128, 191, chunk, push, cluster)
    check_same_bits(m, f"bf16 hd128 chunk {chunk} push {push} cluster {cluster}", push_expected=push and cluster)


@cuda_only
@pytest.mark.parametrize("cfg,name", [(CFG_G3, "G3 hd128"), (CFG_G4, "G4 hd64"), (CFG_G8, "G8 hd64"),
                                      (CFG, "G2 hd64")])
@pytest.mark.parametrize("push", [False, True])
def test_wide_same_bits_heads(cfg, name, push):
    # the P V head split for 2, 3, 4 and 8 query heads per kv head (8: two blocks of 4)
    m = bf16_model(cfg, 193, 128, push, True)
    check_same_bits(m, f"bf16 {name} push {push}", push_expected=push)


@cuda_only
def test_wide_same_bits_defaults():
    # the engine's defaults with the option: head_dim 128 (pull merge) and head_dim 64 (push)
    check_same_bits(gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=195), "bf16 hd128 default",
                    push_expected=False)
    check_same_bits(gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=197), "bf16 hd64 default",
                    push_expected=True)


@cuda_only
@pytest.mark.parametrize("chunk,cluster", [(64, True), (64, False), (128, True)])
def test_wide_same_bits_long(chunk, cluster):
    # one sequence of up to 290 keys: 5 chunks of 64 (3 of 128), cluster or workspace merge
    m = bf16_model(CFG128, 199, chunk, False, cluster)
    check_same_bits(m, f"bf16 hd128 long chunk {chunk} cluster {cluster}", prompts=LONG, new=60, eager=False)


@cuda_only
def test_wide_same_bits_fp16():
    check_same_bits(fa_on(gk.llm.random_model(CFG128, device="cuda", dtype="float16", seed=201)), "fp16 hd128")
    check_same_bits(fa_on(gk.llm.random_model(CFG_G4, device="cuda", dtype="float16", seed=203)), "fp16 G4 hd64")


@cuda_only
@pytest.mark.parametrize("quantize", ["fp8", "int4"])
def test_wide_same_bits_quantized(quantize):
    # fp8: the fused attention by default (push); int4: with fused_attention on
    m = gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=205, quantize=quantize)
    if quantize == "int4":
        fa_on(m)
    check_same_bits(m, f"{quantize}", push_expected=True)


@cuda_only
def test_wide_with_early_rope():
    # early rope is ignored with wide (the wide kernels compute the rotations after the wait):
    # the same bits as without both (early rope is the same bits as without it)
    m = bf16_model(CFG128, 207)
    m._m.fused_attention_wide = 0
    base = run_p(m, True, PROMPTS, new=NEW)
    m._m.fused_attention_early_rope = True
    for w in (2, 4):
        m._m.fused_attention_wide = w
        _, _, w0 = counters(m)
        same(base, run_p(m, True, PROMPTS, new=NEW), f"wide {w} + early rope, graph")
        assert counters(m)[2] > w0, "the wide kernels did not run"
    m._m.fused_attention_wide = 0
    m._m.fused_attention_early_rope = False


@cuda_only
def test_wide_ignored_without_mma_or_big_chunks():
    m = bf16_model(CFG128, 209)
    m._m.fused_attention_mma = False
    check_same_bits(m, "bf16 hd128 no mma", taken=False, eager=False)
    m._m.fused_attention_mma = True
    m._m.fused_attention_chunk = 256
    check_same_bits(m, "bf16 hd128 chunk 256", taken=False, eager=False)


@cuda_only
@pytest.mark.parametrize("wide", [2, 4])
def test_wide_stamps(wide):
    # the debug stamps (bench/e2e_trace.py) with the wide kernels: the same bits, every CTA
    # that wrote its output stamped all 8 phases in order
    m = bf16_model(CFG128, 211)
    base = run_p(m, True, PROMPTS, new=20)
    m._m.fused_attention_wide = wide
    m._m.set_attention_stamps(1)
    same(base, run_p(m, True, PROMPTS, new=20), f"wide {wide}, stamps on, graph")
    assert counters(m)[2] > 0, "the wide kernels did not run"
    st = np_of(m._m.attention_stamps()).astype(np.int64)
    done = st[st[:, 7] > 0]
    assert len(done) >= 2, f"no complete stamp rows: {st[st[:, 0] > 0][:4]}"
    assert (done > 0).all(), f"a phase without a stamp: {done[(done == 0).any(axis=1)][:4]}"
    d = np.diff(done, axis=1)
    assert (d >= 0).all(), f"stamps out of order: {done[(d < 0).any(axis=1)][:4]}"
    m._m.set_attention_stamps(-1)
    m._m.fused_attention_wide = 0


@cuda_only
@pytest.mark.parametrize("chunk", [64, 128])
def test_wide_auto_by_grid_kernel(chunk):
    # wide -1: 4 times the warps while the CTAs (sequences x kv heads x chunks) fit two per SM,
    # else 2; the same bits as wide 0 either way (kernel level, 8 kv heads, head_dim 128)
    from test_llm_attention_fused import attn_case
    sms = gk.cuda.get_device_properties("cuda:0")["multiprocessors"]
    for B, want4 in ((1, True), (8, False)):  # (the fused kernel takes up to 8 sequences)
        bs, mb = 16, 40  # 640-key tables: 10 / 5 chunks of 64 / 128 (10: the workspace merge)
        S = (bs * mb + chunk - 1) // chunk
        assert (B * 8 * S <= 2 * sms) == want4, (B, S, sms)
        pos = [(37 * b + 400) % 600 + 30 for b in range(B)]
        case = attn_case("bfloat16", B, 32, 8, 128, bs, B * mb + 3, mb, pos, seed=B)
        qkv, kc, vc, p, bt = case
        outs = {}
        for w in (0, -1):
            k, v = arr(kc.copy(), "cuda"), arr(vc.copy(), "cuda")
            out, _, merge = _C.llm.fused_attention_rope(
                arr(qkv, "cuda"), 32, k, v, arr(p, "cuda"), arr(bt, "cuda"),
                chunk=chunk, cluster=True, mma=True, push=True, wide=w, with_merge=True)
            outs[w] = (np_of(out), np_of(k), np_of(v), merge)
        assert outs[0][3] & 12 == 0, f"B {B}: wide 0 ran the wide kernels ({outs[0][3]})"
        assert outs[-1][3] & 4, f"B {B}: wide -1 did not run the wide kernels ({outs[-1][3]})"
        assert bool(outs[-1][3] & 8) == want4, f"B {B}: {B * 8 * S} CTAs, merge code {outs[-1][3]}"
        for i, what in enumerate(("out", "k cache", "v cache")):
            assert np.array_equal(outs[0][i].view(np.uint16), outs[-1][i].view(np.uint16)), f"B {B}: {what} differs"


@cuda_only
def test_wide_auto_engine_choice():
    # the engine's -1: int4 weights take 2 (no 4x layers), bf16 with few CTAs takes 4; the same bits as 0
    m = gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=213, quantize="int4")
    fa_on(m)
    m._m.fused_attention_wide = 0
    base = run_p(m, True, PROMPTS, new=20)
    m._m.fused_attention_wide = -1
    f1, w1, q1 = m._m.fused_attention_layers, m._m.fused_attention_wide_layers, m._m.fused_attention_wide4_layers
    same(base, run_p(m, True, PROMPTS, new=20), "int4, wide -1")
    f2, w2, q2 = m._m.fused_attention_layers, m._m.fused_attention_wide_layers, m._m.fused_attention_wide4_layers
    assert f2 > f1 and w2 - w1 == f2 - f1 and q2 == q1, (f1, f2, w1, w2, q1, q2)
    m = bf16_model(CFG128, 215)
    m._m.fused_attention_wide = 0
    base = run_p(m, True, PROMPTS, new=20)
    m._m.fused_attention_wide = -1
    f1, q1 = m._m.fused_attention_layers, m._m.fused_attention_wide4_layers
    same(base, run_p(m, True, PROMPTS, new=20), "bf16, wide -1")
    f2, q2 = m._m.fused_attention_layers, m._m.fused_attention_wide4_layers
    assert f2 > f1 and q2 - q1 == f2 - f1, (f1, f2, q1, q2)


@cuda_only
def test_wide_differs_from_nothing():
    # guard: the comparison can fail (a different seed gives other logits)
    a = run_p(bf16_model(CFG128, 191), True, PROMPTS, new=4)
    b = run_p(bf16_model(CFG128, 192), True, PROMPTS, new=4)
    with pytest.raises(AssertionError):
        same(a, b, "two seeds")
    assert not np.array_equal(a[1][0], b[1][0])
