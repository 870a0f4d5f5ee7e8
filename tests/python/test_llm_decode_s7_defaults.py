"""Session 7's engine defaults (src/llm/model.cpp, decided by checkpoint A of session 7) and
the late L2 prefetch of the o weight (attn_l2 3 / 4, src/cuda/llm_attention_kernel.cuh):
- fused_attention_auto_hd64 (on): head_dim 64 with bf16 weights takes the fused attention,
  with the push merge (fused_attention_push_auto, on: head_dim 64 and quantized weights) in
  128-key chunks; without push_auto in one CTA per kv head (the old chunk-0 rule);
- fused_attention_auto_quant (on) takes fp8 weights only, with quantized_attention_pdl (on);
  int4 stays on rope_append + attention_decode (the same bits as with every new option off);
- head_dim 128 with bf16 weights: the pull merge as before (push_auto does not apply).
Which path ran is read from the engine's counters (fused_attention_layers and
fused_attention_push_layers, the latter from the kernel dispatcher's answer), and the bits
are compared with the explicit settings of the same path. Where the path changes (1B, fp8)
the logits stay within rounding of the old path's. CUDA parts skip without a GPU."""
import numpy as np
import pytest

import gpukit as gk

from test_llm_decode_s6 import ONE, fa_on, run_p
from test_llm_step import CFG, CFG128, PROMPTS, cuda_only, same

NEW = 100  # one prompt of 37 tokens + 100: 2 chunks of 128 keys in the last steps


def counters(m):
    return m._m.fused_attention_layers, m._m.fused_attention_push_layers


def old_defaults(m):
    # the defaults before session 7's checkpoint A
    m._m.fused_attention_auto_hd64 = False
    m._m.fused_attention_auto_quant = False
    m._m.quantized_attention_pdl = False
    m._m.fused_attention_push_auto = False
    m._m.quantized_pdl_fp8 = False
    return m


def close(a, b, what, tol=3e-2):
    # logits within rounding while the tokens agree (the first differing token ends the comparison)
    n = 0
    for t, (x, y) in enumerate(zip(a[1], b[1])):
        if a[0][:t] != b[0][:t]:
            break
        rel = float(np.max(np.abs(x - y)) / np.max(np.abs(x)))
        assert rel < tol, f"{what}: step {t} max rel diff {rel:.3g}"
        n += 1
    assert n >= 2, f"{what}: tokens differ from step {n}"
    print(f"\n{what}: {n} steps compared")


def test_defaults_cpu():
    m = gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1)
    o = m._m
    assert o.fused_attention_auto_hd64 and o.fused_attention_auto_quant and o.quantized_attention_pdl
    assert o.fused_attention_push_auto and not o.fused_attention_push
    assert o.quantized_pdl_fp8 and not o.quantized_pdl
    assert o.fused_attention_push_layers == 0
    ref = old_defaults(gk.llm.random_model(CFG, device="cpu", dtype="float32", seed=1))
    same(run_p(m, False, ONE, new=3), run_p(ref, False, ONE, new=3), "CPU: the new defaults have no effect")


@cuda_only
def test_hd64_default_takes_fused_push():
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=61)
    f0, p0 = counters(m)
    got = run_p(m, True, ONE, new=NEW)
    f1, p1 = counters(m)
    assert f1 > f0, "head_dim 64: the fused attention was not taken by default"
    assert p1 > p0, "head_dim 64: the push merge was not taken by default"
    same(got, run_p(m, False, ONE, new=NEW), "hd64 default: graph vs eager")
    # the bits of the explicit settings: fused_attention + push, 128-key chunks
    m._m.fused_attention_auto_hd64 = False
    m._m.fused_attention = True
    m._m.fused_attention_push = True
    same(got, run_p(m, True, ONE, new=NEW), "hd64 default vs fused_attention + fused_attention_push")
    # push and pull merge: the same bits (push_auto off, push off: pull)
    m._m.fused_attention_push = False
    m._m.fused_attention_push_auto = False
    f2, p2 = counters(m)
    same(got, run_p(m, True, ONE, new=NEW), "hd64: the pull merge")
    assert counters(m)[1] == p2 and counters(m)[0] > f2, "pull: the push merge was taken"
    # the old default (rope_append + attention_decode): other bits, within rounding
    old = old_defaults(gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=61))
    f3, _ = counters(old)
    before = run_p(old, True, ONE, new=NEW)
    assert counters(old)[0] == f3, "old defaults: the fused attention was taken"
    close(got, before, "hd64: fused + push vs rope_append + attention_decode")


@cuda_only
def test_hd64_without_push_auto_one_cta_per_kv_head():
    # push_auto off: auto_hd64 keeps the chunk-0 rule (the bits of fused_attention + chunk 0)
    m = gk.llm.random_model(CFG, device="cuda", dtype="bfloat16", seed=67)
    m._m.fused_attention_push_auto = False
    got = run_p(m, True, ONE, new=NEW)
    assert counters(m)[1] == 0, "push taken with push_auto off"
    m._m.fused_attention_auto_hd64 = False
    m._m.fused_attention = True
    m._m.fused_attention_chunk = 0
    same(got, run_p(m, True, ONE, new=NEW), "auto_hd64 without push_auto vs fused_attention + chunk 0")


@cuda_only
@pytest.mark.parametrize("quantize", ["fp8", "int4"])
def test_quantized_defaults(quantize):
    m = gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=71, quantize=quantize)
    f0, p0 = counters(m)
    got = run_p(m, True, ONE, new=NEW)
    f1, p1 = counters(m)
    old = old_defaults(gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=71, quantize=quantize))
    before = run_p(old, True, ONE, new=NEW)
    assert counters(old)[0] == 0, f"{quantize}, old defaults: the fused attention was taken"
    if quantize == "int4":  # since session 8 (fused_attention_auto_quant takes int4): the fused attention
        assert f1 > f0, "int4: the fused attention was not taken by default"
        x = gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=71, quantize=quantize)
        x._m.fused_attention_auto_quant = False
        x._m.fused_attention = True
        same(got, run_p(x, True, ONE, new=NEW), "int4 default vs fused_attention")
        close(got, before, "int4: fused attention vs rope_append + attention_decode")
        return
    assert f1 > f0 and p1 > p0, f"fp8: fused attention layers {f1 - f0}, with push {p1 - p0}"
    same(got, run_p(m, False, ONE, new=NEW), "fp8 default: graph vs eager")
    # the explicit settings of the same path: the same bits
    x = gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=71, quantize=quantize)
    x._m.fused_attention_auto_quant = False
    x._m.fused_attention = True
    x._m.fused_attention_push = True
    x._m.fused_attention_push_auto = False
    same(got, run_p(x, True, ONE, new=NEW), "fp8 default vs fused_attention + push (+ quantized_attention_pdl)")
    x._m.quantized_pdl_fp8 = False
    same(got, run_p(x, True, ONE, new=NEW), "fp8 default vs fused_attention + push, quantized_pdl_fp8 off")
    x._m.quantized_attention_pdl = False
    x._m.fused_attention_push = False
    same(got, run_p(x, True, ONE, new=NEW), "fp8 default vs fused_attention, pull merge, no PDL")
    close(got, before, "fp8: fused attention vs rope_append + attention_decode")


@cuda_only
@pytest.mark.parametrize("quantize", ["fp8", "int4"])
def test_quantized_pdl_fp8(quantize):
    # quantized_pdl_fp8 (on): fp8 weights launch the engine's kernels between the quantized GEMVs
    # with PDL (quantized_pdl), int4 not; only launch order: the same bits as quantized_pdl off /
    # on, graph and eager, over three sequences of different lengths
    m = gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=83, quantize=quantize)
    assert m._m.quantized_pdl_fp8 and not m._m.quantized_pdl
    got = run_p(m, True, PROMPTS, new=60)
    same(got, run_p(m, False, PROMPTS, new=60), f"{quantize} default: graph vs eager")
    m._m.quantized_pdl_fp8 = False
    same(got, run_p(m, True, PROMPTS, new=60), f"{quantize}: quantized_pdl_fp8 off")
    m._m.quantized_pdl = True
    same(got, run_p(m, True, PROMPTS, new=60), f"{quantize}: quantized_pdl on")


@cuda_only
def test_bf16_hd128_default_pull():
    m = gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=73)
    f0, p0 = counters(m)
    got = run_p(m, True, ONE, new=NEW)
    assert counters(m)[0] > f0 and counters(m)[1] == p0, f"bf16 head_dim 128: counters {counters(m)} from {f0, p0}"
    same(got, run_p(old_defaults(m), True, ONE, new=NEW), "bf16 head_dim 128: new defaults vs old")


# ---- attn_l2 3 / 4: the o weight's L2 prefetch issued after the K/V have landed ----

@cuda_only
@pytest.mark.parametrize("chunk,push,quantize", [(64, False, None), (64, True, None), (128, False, None),
                                                 (128, True, None), (128, True, "fp8")])
def test_late_l2_prefetch_same_bits(chunk, push, quantize):
    # three sequences of different lengths (up to 30 + 110 tokens: keyless chunks for the
    # short ones, whose parts the last chunk with keys issues), graph and eager; only a cache
    # hint: the same bits
    m = fa_on(gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=79, quantize=quantize))
    m._m.fused_attention_chunk = chunk
    m._m.fused_attention_push = push
    m._m.fused_attention_push_auto = False
    base = run_p(m, True, PROMPTS, new=110)
    f0, p0 = counters(m)
    for v in (3, 4):
        m._m.attn_l2 = v
        same(base, run_p(m, True, PROMPTS, new=110), f"attn_l2={v}, graph")
    same(base, run_p(m, False, PROMPTS, new=110), "attn_l2=4, eager")
    f1, p1 = counters(m)
    assert f1 > f0 and (p1 > p0) == push, f"fused attention layers {f1 - f0}, with push {p1 - p0}"
    m._m.attn_l2 = 0
