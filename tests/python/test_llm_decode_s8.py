"""Session 8 preparation (branch engine9): EngineOptions::fused_attention_early_rope.

The fused decode attention (src/cuda/llm_attention_kernel.cuh, template flag ER; MMA passes,
chunks of 64 / 128 keys) computes the rotations' cos / sin (times the rope mscale) and the
new token's cache slot before its PDL wait instead of after it. The same arithmetic on the
same inputs, so the same bits: every test compares bit for bit (tokens and logits) with the
option off, over the merges (pull / push cluster merge, workspace merge), both chunk sizes,
head_dim 64 / 128, bf16 and fp8 / int4 weights, a YaRN model (mscale != 1), graph and
eager, three sequences of different lengths (keyless chunks). Which path ran is read from
the engine's counters (fused_attention_layers / fused_attention_push_layers). CUDA parts
skip without a GPU."""
import numpy as np
import pytest

import gpukit as gk

from test_llm_decode_s6 import fa_on, run_p
from test_llm_step import CFG, CFG128, PROMPTS, cuda_only, same

NEW = 110  # up to 30 + 110 tokens: two 128-key chunks / three 64-key chunks in the last steps
YARN = dict(CFG128, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})


def counters(m):
    return m._m.fused_attention_layers, m._m.fused_attention_push_layers


def test_early_rope_option_cpu():
    m = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)
    assert m._m.fused_attention_early_rope is False, "fused_attention_early_rope must be off by default"
    base = run_p(m, False, PROMPTS, new=3)
    m._m.fused_attention_early_rope = True
    assert m._m.fused_attention_early_rope is True
    same(base, run_p(m, False, PROMPTS, new=3), "CPU: fused_attention_early_rope has no effect")


def check_same_bits(m, what, push_expected=None):
    m._m.fused_attention_early_rope = False
    base = run_p(m, True, PROMPTS, new=NEW)
    f0, p0 = counters(m)
    m._m.fused_attention_early_rope = True
    same(base, run_p(m, True, PROMPTS, new=NEW), f"{what}: early rope, graph")
    same(base, run_p(m, False, PROMPTS, new=NEW), f"{what}: early rope, eager")
    f1, p1 = counters(m)
    assert f1 > f0, f"{what}: the fused attention was not taken (layers {f0} -> {f1})"
    if push_expected is not None:
        assert (p1 > p0) == push_expected, f"{what}: push layers {p0} -> {p1}, push expected {push_expected}"
    m._m.fused_attention_early_rope = False
    print(f"\n{what}: same bits ({f1 - f0} fused attention layers, {p1 - p0} with push)")


@cuda_only
@pytest.mark.parametrize("chunk,push,cluster", [(128, False, True), (128, True, True), (64, False, True),
                                                (64, True, True), (128, False, False), (64, False, False)])
def test_early_rope_same_bits_bf16_hd128(chunk, push, cluster):
    m = fa_on(gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=91))
    m._m.fused_attention_chunk = chunk
    m._m.fused_attention_push = push
    m._m.fused_attention_push_auto = False
    m._m.fused_attention_cluster = cluster
    check_same_bits(m, f"bf16 hd128 chunk {chunk} push {push} cluster {cluster}", push and cluster)


@cuda_only
def test_early_rope_same_bits_defaults():
    # the engine's defaults with the option: head_dim 128 (pull merge) and head_dim 64 (push)
    check_same_bits(gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=93), "bf16 hd128 default",
                    False)
    check_same_bits(gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=95), "bf16 hd64 default", True)


@cuda_only
def test_early_rope_same_bits_fp16():
    m = fa_on(gk.llm.random_model(CFG128, device="cuda", dtype="float16", seed=97))
    check_same_bits(m, "fp16 hd128")


@cuda_only
def test_early_rope_same_bits_yarn():
    # YaRN: the rotations scaled by mscale (computed before the wait with the option)
    m = fa_on(gk.llm.random_model(YARN, device="cuda", dtype="bfloat16", seed=99))
    check_same_bits(m, "bf16 hd128 yarn")


@cuda_only
@pytest.mark.parametrize("quantize", ["fp8", "int4"])
def test_early_rope_same_bits_quantized(quantize):
    # fp8: the fused attention by default (push, quantized_attention_pdl, quantized_pdl_fp8);
    # int4: with fused_attention on (its default is rope_append + attention_decode)
    m = gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=101, quantize=quantize)
    if quantize == "int4":
        fa_on(m)
    check_same_bits(m, f"{quantize}", True)


@cuda_only
def test_early_rope_not_mma_ignored():
    # without the MMA passes (and with 256-key chunks) the option is ignored: the same bits
    m = fa_on(gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=103))
    m._m.fused_attention_mma = False
    check_same_bits(m, "bf16 hd128 no mma")
    m._m.fused_attention_mma = True
    m._m.fused_attention_chunk = 256
    check_same_bits(m, "bf16 hd128 chunk 256")


@cuda_only
def test_early_rope_differs_from_nothing():
    # guard: the comparison can fail (a different seed gives other logits)
    a = run_p(gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=91), True, PROMPTS, new=4)
    b = run_p(gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=92), True, PROMPTS, new=4)
    with pytest.raises(AssertionError):
        same(a, b, "two seeds")
    assert not np.array_equal(a[1][0], b[1][0])


# ---- o_proj_stage: the o GEMV after the fused attention, half of each block's rows staged
# in shared memory before its PDL wait (k_project_stage2): the same bits ----

def check_stage_same_bits(m, what, prompts=PROMPTS, new=40):
    m._m.o_proj_stage = False
    base = run_p(m, True, prompts, new=new)
    f0, _ = counters(m)
    m._m.o_proj_stage = True
    same(base, run_p(m, True, prompts, new=new), f"{what}: o_proj_stage, graph")
    same(base, run_p(m, False, prompts, new=new), f"{what}: o_proj_stage, eager")
    m._m.fused_attention_early_rope = True
    same(base, run_p(m, True, prompts, new=new), f"{what}: o_proj_stage + early rope, graph")
    f1, _ = counters(m)
    m._m.o_proj_stage = False
    m._m.fused_attention_early_rope = False
    print(f"\n{what}: same bits ({f1 - f0} fused attention layers)")
    return f1 - f0


def test_o_proj_stage_option_cpu():
    m = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)
    assert m._m.o_proj_stage is True, "o_proj_stage is on by default (session 8)"
    m._m.o_proj_stage = False
    base = run_p(m, False, PROMPTS, new=3)
    m._m.o_proj_stage = True
    same(base, run_p(m, False, PROMPTS, new=3), "CPU: o_proj_stage has no effect")


@cuda_only
@pytest.mark.parametrize("cfg,dtype", [("128", "bfloat16"), ("64", "bfloat16"), ("128", "float16"),
                                       ("wide", "bfloat16")])
def test_o_proj_stage_same_bits(cfg, dtype):
    # one sequence (the staged kernel: m == 1) and three (not taken: m > 1); head_dim 128 / 64;
    # "wide": hidden 1032 = 129 blocks of 8 rows (an odd block count), o's k = 4 x 128
    c = {"128": CFG128, "64": CFG, "wide": dict(CFG128, hidden_size=1032)}[cfg]
    m = gk.llm.random_model(c, device="cuda", dtype=dtype, seed=107)
    assert check_stage_same_bits(m, f"{cfg} {dtype}, one sequence", prompts=[PROMPTS[2]], new=NEW) > 0
    check_stage_same_bits(m, f"{cfg} {dtype}, three sequences")


@cuda_only
def test_o_proj_stage_long_rows_fall_back():
    # o's rows of 36 x 128 = 4608 elements (> 4096: one round of loads does not cover them):
    # the plain GEMV; the option changes nothing
    c = dict(CFG128, num_attention_heads=36, num_key_value_heads=6)
    m = gk.llm.random_model(c, device="cuda", dtype="bfloat16", seed=109)
    check_stage_same_bits(m, "o rows of 4608", prompts=[PROMPTS[1]])


@cuda_only
@pytest.mark.parametrize("quantize", ["fp8", "int4"])
def test_o_proj_stage_quantized_untouched(quantize):
    # quantized weights: the o projection is not the engine's GEMV; the same bits
    m = gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=111, quantize=quantize)
    check_stage_same_bits(m, f"{quantize}", prompts=[PROMPTS[2]])


# ---- quantized_small_pdl: quantized weights without quantized_pdl (int4 / int8), PDL for the
# add_rms_norm (1) and / or SwiGLU (2) launches only: the same bits ----

def test_quantized_small_pdl_option_cpu():
    m = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)
    assert m._m.quantized_small_pdl == 3, "quantized_small_pdl is 3 by default (session 9)"
    m._m.quantized_small_pdl = 2
    assert m._m.quantized_small_pdl == 2
    with pytest.raises(ValueError, match="quantized_small_pdl"):
        m._m.quantized_small_pdl = 4


@cuda_only
@pytest.mark.parametrize("quantize", ["int4", "fp8"])
def test_quantized_small_pdl_same_bits(quantize):
    # int4: the option applies (quantized_pdl off); fp8 takes quantized_pdl (quantized_pdl_fp8):
    # the option has nothing to lift; one and three sequences, graph and eager
    m = gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=113, quantize=quantize)
    for prompts in ([PROMPTS[2]], PROMPTS):
        m._m.quantized_small_pdl = 0
        base = run_p(m, True, prompts, new=40)
        for v in (1, 2, 3):
            m._m.quantized_small_pdl = v
            same(base, run_p(m, True, prompts, new=40), f"{quantize}: quantized_small_pdl={v}, graph")
        same(base, run_p(m, False, prompts, new=40), f"{quantize}: quantized_small_pdl=3, eager")
        m._m.fused_attention = True  # with the fused attention too (int4: not its default)
        m._m.quantized_small_pdl = 0
        base_fa = run_p(m, True, prompts, new=40)
        m._m.quantized_small_pdl = 3
        m._m.fused_attention_early_rope = True
        same(base_fa, run_p(m, True, prompts, new=40), f"{quantize}: fused attention, small pdl 3 + early rope")
        m._m.fused_attention = False
        m._m.fused_attention_early_rope = False
    m._m.quantized_small_pdl = 0
