"""Fused inference ops: normalization, gated activations and positions.

    import gpukit as gk
    y, r = gk.nn.rms_norm(x, w, eps=1e-6, residual=r)   # r = x + r; y = rms_norm(r)
    h = gk.nn.swiglu(gate_up)                            # [..., 2I] -> [..., I]

All take float32, float16 or bfloat16 arrays (fp32 math) and an optional stream.
"""
from __future__ import annotations

from ._C import (  # noqa: F401
    rms_norm, layer_norm, swiglu, geglu, relu2,
    attention_decode, attention_prefill, kv_append, rope, rope_inv_freq, alibi_slopes, alibi_bias, sinusoidal_positions,
)

__all__ = ["rms_norm", "layer_norm", "swiglu", "geglu", "relu2", "attention_decode", "attention_prefill", "kv_append", "rope", "rope_inv_freq", "alibi_slopes",
           "alibi_bias", "sinusoidal_positions"]
