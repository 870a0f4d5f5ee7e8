"""The engines of bench/e2e.py: gk engine names with their options, and the environment of a run.

More gpukit engines: gk-ops and gk-unfused are gk-graph with the layers composed of the
gk.nn fused ops (fusion level 1, the engine of the last release) or unfused (level 0:
separate q/k/v and gate/up projections, add + rms_norm, rope then kv_append, silu then
mul), the "before" of the fused kernels. A gk engine may carry options after '+': nopdl
(no programmatic dependent launch), ropeqkv / norope (RoPE and the KV append in the q/k/v
GEMV's epilogue, or a separate launch: the default), tail / notail (the residual add +
RMSNorm in the o/down GEMV's last block, or its own launch: the default), e.g.
gk-graph+ropeqkv+nopdl; gk-nopdl and gk-norope are short for gk-graph+nopdl and
gk-graph+norope. More options: pf<MiB> (L2 prefetch of the next weights on a side branch
while attention runs, EngineOptions::prefetch_mb), pflast (its lines evict-last), hp /
nohp (the lm head through the engine's GEMV), emb / noemb (embedding + first norm in one
launch), dq / nodq (quantized prefill through the dequantized weight and cuBLASLt, or
the GEMV per 8 rows), fa / nofa / fa64 (RoPE, the KV append and attention in one launch; fa64: 64-key chunks), fat0..fat3
(nofa: not even where fused_attention_auto takes it; where the fused attention lets the o GEMV launch: before its wait, after reading q/k/v, after
P V, at exit; EngineOptions::fused_attention_trigger), fac<N> (its keys per CTA: 64, 128, 256, 384,
0 = one CTA per kv head where the context fits), facl (its 2..8 chunks merge through a thread
block cluster's shared memory), ol2<0-4> (rope_append / the fused attention
brings the o weight into L2 before its wait: 1 its second half, 2 all; 3 / 4 the same, issued by
the fused attention after its cached K/V have landed; EngineOptions::attn_l2), kvl2
(the q/k/v GEMV's last blocks bring the layer's KV pages into L2: EngineOptions::kv_l2), cv<0-100>
(the engine kernels' preferred shared memory carveout in percent: EngineOptions::carveout), nip /
nonip (no norm launches: residual adds in the o/down GEMVs, norms inside the q/k/v,
gate/up and lm head GEMVs), qpdl / noqpdl (quantized weights: the engine's launches between
the quantized GEMVs with / without PDL), qpdlc (with PDL, the SwiGLU / rope_append grids capped at
4 blocks and the fused attention without PDL: EngineOptions::quantized_pdl_compact), wef / nowef
(the engine GEMV's weight loads tagged L2 evict-first: EngineOptions::weights_evict_first),
famma / nofamma (the fused attention's tensor-core score pass and 16-byte P V pass:
EngineOptions::fused_attention_mma), fap<N> (the fused attention's CTAs ask for N KiB of shared
memory, keeping other kernels' blocks off their SMs: EngineOptions::fused_attention_pad_kb), qstr / noqstr (quantized weights: each decode GEMV's codes
in an L2 access policy window marked streaming: EngineOptions::quant_streaming), fapush / nofapush
(the fused attention's cluster merge by push: chunks 1..S-1 st.async their partials into chunk 0's
shared memory, an mbarrier there; EngineOptions::fused_attention_push), qapdl / noqapdl (quantized
weights without qpdl: the fused attention alone launched with PDL; EngineOptions::quantized_attention_pdl),
faa64 / nofaa64, faaq / nofaaq (fused_attention_auto also takes head_dim 64 / fp8 weights, defaults
since session 7: EngineOptions::fused_attention_auto_hd64 / _quant), fapa / nofapa (the push merge
where measured faster without fapush: head_dim 64 and quantized weights, the default;
EngineOptions::fused_attention_push_auto), qpdl8 / noqpdl8 (fp8 weights take qpdl, the default since
session 7's final run: EngineOptions::quantized_pdl_fp8), faer / nofaer (the fused attention's RoPE
cos / sin and new-token slot before its PDL wait: EngineOptions::fused_attention_early_rope), ost /
noost (the o GEMV after the fused attention stages half of its rows in shared memory before its
PDL wait: EngineOptions::o_proj_stage), qsp<N> (quantized weights without qpdl: PDL for the norms
(N = 1), SwiGLU (2) or both (3): EngineOptions::quantized_small_pdl), qfr<N> (fp8 / int8 weights: the
staged GEMVs whose ring can hold each warp's whole k range with all CTAs resident request every
weight byte before their PDL wait, N a mask: 1 the shapes with N > K (q/k/v), 2 the others (o), 3
both: EngineOptions::quantized_full_ring), qxp / noqxp (fp8 / int8 weights: the norms before the
q/k/v, gate/up and lm head GEMVs also write the scaled fp16 x those GEMVs read:
EngineOptions::quantized_x_prep), qsw / noqsw (int4 weights: the SwiGLU in the gate/up GEMV's epilogue
where the integer tensor-core kernel runs it: EngineOptions::quantized_swiglu), faw<N> (the fused attention
with N = 2 / 4 times the warps per CTA, 0 off, fawa the default -1: 2 with int4 weights, else 4 where
the launch's CTAs fit two per SM, else 2: EngineOptions::fused_attention_wide).
Environment knobs of other areas for one engine's run (set before it, restored after it):
w8a (GPUKIT_GEMV_W8=4,3,16,1,0: the 8-bit GEMVs' configuration of session 5's checkpoint A,
before the default became 4,2,16,1,3,0,0), w4irec0 / w4irec1 (GPUKIT_W4I_REC: the int4 integer GEMV's x at
M > 1 per row / in per-block records, session 17), dec<N> (GPUKIT_DECODE_SPLIT=32,1024,128,N: the
decode attention's variant N, e.g. dec24 the cluster kernel that B = 1 took at that checkpoint,
dec18 the CTA group units the default takes now), w4v<V> (GPUKIT_GEMV_W4_VARIANT=V: the staged 4-bit
GEMV's variant at every shape), w4s<V> (GPUKIT_GEMV_W4_SMALL=V: that variant for the short projections
only, at most 32 Mi weights: o and q/k/v of the 8B model), w4o<V> (GPUKIT_GEMV_W4_O=V: the same for at
most 16 Mi weights, the 8B o projection but not its q/k/v; before w4s), w8s<KB-D-WT[-RT...]> (GPUKIT_GEMV_W8_SMALL
with '-' for ',': GPUKIT_GEMV_W8's fields for 8-bit weights of at most 32 MiB only), w8o<KB-D-WT...>
(GPUKIT_GEMV_W8_O: the same for at most 16 MiB, the 8B o projection but not its q/k/v; before w8s),
w8k<KB-D-WT...> (GPUKIT_GEMV_W8 itself, every shape).
Each gk run prints the node count of its captured decode step.
"""
from __future__ import annotations

import re


class _Engines(tuple):
    """The engine names; `in` also accepts gk engines with +options (gk_engine)."""

    def __contains__(self, e):
        return tuple.__contains__(self, e) or gk_engine(e) is not None


ENGINES = _Engines(("gk-graph", "gk-eager", "gk-ops", "gk-unfused", "gk-nopdl", "gk-norope", "hf-eager",
                    "hf-compile"))
FUSION = {"gk-ops": 1, "gk-unfused": 0}  # model.fusion of the gk engines (default 2)
GK_LABEL = {"gk-graph": "", "gk-eager": " (eager)", "gk-ops": " (ops fused)", "gk-unfused": " (unfused)"}
GK_ALIAS = {"gk-nopdl": "gk-graph+nopdl", "gk-norope": "gk-graph+norope"}


# Engine options that set another area's environment knob for one run (engine_env).
ENV_OPTIONS = {"w8a": {"GPUKIT_GEMV_W8": "4,3,16,1,0"},
               "w4irec0": {"GPUKIT_W4I_REC": "0"}, "w4irec1": {"GPUKIT_W4I_REC": "1"}}


class engine_env:
    """Sets the environment variables of a gk engine's options (gk_engine's "env") for the
    duration of a run and restores the previous values after it."""

    def __init__(self, env):
        self.env, self.saved = dict(env or {}), {}

    def __enter__(self):
        import os
        for k, v in self.env.items():
            self.saved[k] = os.environ.get(k)
            os.environ[k] = v
        return self

    def __exit__(self, *exc):
        import os
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        return False


def gk_engine(eng):
    """(base, options) of a gk engine name such as gk-graph+ropeqkv+pf32, or None."""
    parts = GK_ALIAS.get(eng, eng).split("+")
    if parts[0] not in GK_LABEL:
        return None
    opt = dict(graph=parts[0] != "gk-eager", fusion=FUSION.get(parts[0], 2), pdl=None, rope_in_qkv=None,
               norm_in_tail=None, attrs={}, env={})
    for f in parts[1:]:
        if f in ENV_OPTIONS:  # another area's environment knob for this run (engine_env)
            opt["env"].update(ENV_OPTIONS[f])
        elif re.fullmatch(r"w4v\d\d?", f):  # the staged 4-bit GEMV's variant (GPUKIT_GEMV_W4_VARIANT)
            opt["env"]["GPUKIT_GEMV_W4_VARIANT"] = f[3:]
        elif re.fullmatch(r"w4s\d\d?", f):  # the 4-bit GEMV's variant for the short projections (GPUKIT_GEMV_W4_SMALL)
            opt["env"]["GPUKIT_GEMV_W4_SMALL"] = f[3:]
        elif re.fullmatch(r"w4o\d\d?", f):  # the same for at most 16 Mi weights (GPUKIT_GEMV_W4_O)
            opt["env"]["GPUKIT_GEMV_W4_O"] = f[3:]
        elif re.fullmatch(r"w8s\d+(-\d+){2,10}", f):  # the 8-bit GEMV's knob for the short projections, '-' for ','
            opt["env"]["GPUKIT_GEMV_W8_SMALL"] = f[3:].replace("-", ",")
        elif re.fullmatch(r"w8o\d+(-\d+){2,10}", f):  # the same for at most 16 MiB (the o projection)
            opt["env"]["GPUKIT_GEMV_W8_O"] = f[3:].replace("-", ",")
        elif re.fullmatch(r"w8k\d+(-\d+){2,10}", f):  # the 8-bit GEMV's knob (GPUKIT_GEMV_W8, every shape), '-' for ','
            opt["env"]["GPUKIT_GEMV_W8"] = f[3:].replace("-", ",")
        elif re.fullmatch(r"dec\d\d?", f):  # the decode attention's variant (attention_decode, GPUKIT_DECODE_SPLIT)
            opt["env"]["GPUKIT_DECODE_SPLIT"] = f"32,1024,128,{int(f[3:])}"
        elif f in ("famma", "nofamma"):  # the fused attention's tensor-core scores and 16-byte P V
            opt["attrs"]["fused_attention_mma"] = f == "famma"
        elif f in ("fapush", "nofapush"):  # the fused attention's cluster merge by push (st.async + mbarrier)
            opt["attrs"]["fused_attention_push"] = f == "fapush"
        elif re.fullmatch(r"fap\d+", f):  # the fused attention's CTAs pad their shared memory to N KiB
            opt["attrs"]["fused_attention_pad_kb"] = int(f[3:])
        elif f in ("qstr", "noqstr"):  # quantized GEMVs: their codes streaming in L2 (access policy window)
            opt["attrs"]["quant_streaming"] = f == "qstr"
        elif f in ("wef", "nowef"):  # the engine GEMV's weight loads L2 evict-first
            opt["attrs"]["weights_evict_first"] = f == "wef"
        elif f == "nopdl":
            opt["pdl"] = False
        elif re.fullmatch(r"pf\d+", f):  # L2 prefetch of the next weights during attention, MiB
            opt["attrs"]["prefetch_mb"] = int(f[2:])
        elif f == "pflast":
            opt["attrs"]["prefetch_last"] = True
        elif f in ("hp", "nohp"):  # lm head through the engine's GEMV
            opt["attrs"]["head_proj"] = f == "hp"
        elif f in ("emb", "noemb"):  # embedding + first norm in one launch
            opt["attrs"]["embed_norm"] = f == "emb"
        elif f in ("dq", "nodq"):  # quantized prefill through the dequantized weight + cuBLASLt
            opt["attrs"]["dequant_prefill"] = f == "dq"
        elif f in ("fa", "nofa", "fa64"):  # RoPE + KV append + attention in one launch (fa64: 64-key chunks)
            opt["attrs"]["fused_attention"] = f != "nofa"
            if f == "nofa":  # nor where fused_attention_auto would take it
                opt["attrs"]["fused_attention_auto"] = False
            if f == "fa64":
                opt["attrs"]["fused_attention_chunk"] = 64
        elif re.fullmatch(r"fac(0|64|128|256|384)", f):  # keys per CTA of the fused attention (0: auto)
            opt["attrs"]["fused_attention_chunk"] = int(f[3:])
        elif f in ("facl", "nofacl"):  # the fused attention's chunks merge through a cluster
            opt["attrs"]["fused_attention_cluster"] = f == "facl"
        elif f in ("kvl2", "nokvl2"):  # the q/k/v GEMV's last blocks prefetch the KV pages into L2
            opt["attrs"]["kv_l2"] = f == "kvl2"
        elif re.fullmatch(r"cv(100|\d\d?)", f):  # the engine kernels' preferred shared memory carveout, %
            opt["attrs"]["carveout"] = int(f[2:])
        elif re.fullmatch(r"ol2[0-4]", f):  # o weight into L2 by the kernel before the o GEMV (3, 4: late)
            opt["attrs"]["attn_l2"] = int(f[3:])
        elif re.fullmatch(r"fat[0-3]", f):  # where the fused attention triggers the next launch
            opt["attrs"]["fused_attention_trigger"] = int(f[3:])
        elif f == "qpdlc":  # quantized_pdl with small grids (and the fused attention without PDL)
            opt["attrs"]["quantized_pdl"] = True
            opt["attrs"]["quantized_pdl_compact"] = True
        elif f in ("faa64", "nofaa64", "faaq", "nofaaq"):  # fused_attention_auto also for head_dim 64 / fp8
            opt["attrs"]["fused_attention_auto_hd64" if f.endswith("faa64") else "fused_attention_auto_quant"] = \
                not f.startswith("no")
        elif f in ("qsp0", "qsp1", "qsp2", "qsp3"):  # quantized, no qpdl: PDL for the norms / SwiGLU only
            opt["attrs"]["quantized_small_pdl"] = int(f[3:])
        elif f in ("qxp", "noqxp"):  # fp8 / int8: the norms write the GEMVs' scaled fp16 x
            opt["attrs"]["quantized_x_prep"] = f == "qxp"
        elif f in ("qsw", "noqsw"):  # int4: the SwiGLU in the gate/up GEMV's epilogue
            opt["attrs"]["quantized_swiglu"] = f == "qsw"
        elif f in ("qfr0", "qfr1", "qfr2", "qfr3"):  # fp8 / int8: the GEMVs' full ring (1 N > K, 2 N <= K)
            opt["attrs"]["quantized_full_ring"] = int(f[3:])
        elif f in ("ost", "noost"):  # the o GEMV after the fused attention: half its rows staged in shared memory
            opt["attrs"]["o_proj_stage"] = f == "ost"
        elif f in ("faw0", "faw2", "faw4", "fawa"):  # the fused attention with 2 / 4 times the warps per CTA
            opt["attrs"]["fused_attention_wide"] = -1 if f == "fawa" else int(f[3:])
        elif f in ("faer", "nofaer"):  # the fused attention's RoPE cos / sin and slot before its PDL wait
            opt["attrs"]["fused_attention_early_rope"] = f == "faer"
        elif f in ("fapa", "nofapa"):  # the push merge where measured faster (head_dim 64, quantized weights)
            opt["attrs"]["fused_attention_push_auto"] = f == "fapa"
        elif f in ("qapdl", "noqapdl"):  # quantized weights: the fused attention alone with PDL
            opt["attrs"]["quantized_attention_pdl"] = f == "qapdl"
        elif f in ("qpdl", "noqpdl"):  # quantized weights: PDL of the engine's launches between the GEMVs
            opt["attrs"]["quantized_pdl"] = f == "qpdl"
        elif f in ("qpdl8", "noqpdl8"):  # fp8 weights take quantized_pdl (default on)
            opt["attrs"]["quantized_pdl_fp8"] = f == "qpdl8"
        elif f in ("nip", "nonip"):  # norms inside the projections, residual adds in their epilogues
            opt["attrs"]["norm_in_proj"] = f == "nip"
        elif f in ("ropeqkv", "norope"):
            opt["rope_in_qkv"] = f == "ropeqkv"
        elif f in ("tail", "notail"):
            opt["norm_in_tail"] = f == "tail"
        else:
            return None
    return parts[0], opt


def gk_label(eng):
    base, _ = gk_engine(eng)
    flags = GK_ALIAS.get(eng, eng).split("+")[1:]
    return GK_LABEL[base] + (f" [{'+'.join(flags)}]" if flags else "")
