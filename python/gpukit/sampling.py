"""Token selection: argmax, top-k, logit processors, filters, seeded sampling and
the fused, graph-capturable decode step.

Definitions (shared exactly by the CPU reference and the CUDA kernels; the C++
header include/gpukit/sampling.h has the full text):

* Processing: logit bias, repetition penalty (CTRL: positive logits divided,
  negative multiplied), frequency (x -= f * count) and presence (x -= p) over the
  row's history, banned ids and EOS ids (while generated < min_tokens) set to -inf,
  then temperature. History ids outside [0, V) are ignored; lengths are clamped to
  [0, Hmax]; entries past a row's length are never read.
* temperature <= 0 is greedy (argmax, ties -> lowest index).
* Weights w_i = floor(exp(s_i - max s) * 2**40) (exact integer masses).
* top-k keeps s >= the k-th largest value (boundary ties kept); top-p keeps the
  largest-valued tokens (over the top-k set) until their mass reaches
  floor(p * mass), boundary ties kept; min-p keeps exp(s - max) >= min_p; typical-p,
  applied last over what is left, keeps the tokens whose (s - max) is closest to
  the w-weighted mean until their mass reaches floor(typical_p * mass).
* Draw: R = 64 bits of Philox4x32-10 keyed by the seed with counter (position,
  row tag, 0); target t = floor(W * R / 2**64) with W the kept mass; the token is
  the first kept id in vocabulary order whose inclusive prefix of w exceeds t.
  In `sample` the row tag is the batch index; in `decode_step` it is 0 and the
  per-row seed is the sequence's identity, so a row's draw does not depend on its
  batch slot.
* NaN logits: the CPU path raises ValueError; CUDA (no host sync) treats NaN as
  -inf. +inf counts as the largest finite float. A row without any finite logit
  gives token -1 and logprob NaN.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

from ._C import _sampling as _s

argmax = _s.argmax
topk = _s.topk
apply_temperature = _s.apply_temperature
apply_penalties = _s.apply_penalties
apply_logit_bias = _s.apply_logit_bias
ban_tokens = _s.ban_tokens
apply_min_tokens = _s.apply_min_tokens
top_k_filter = _s.top_k_filter
top_p_filter = _s.top_p_filter
min_p_filter = _s.min_p_filter
typical_p_filter = _s.typical_p_filter
sample = _s.sample
_philox = _s._philox


@dataclass
class Params:
    """Per-row sampling parameters: each a [B] array on the logits' device, a Python
    scalar (broadcast to every row) or None (the default)."""

    temperature: Any = None          # default 1; <= 0 greedy
    top_k: Any = None                # default off; <= 0 off
    top_p: Any = None                # default 1 (off)
    min_p: Any = None                # default 0 (off)
    typical_p: Any = None            # default 1 (off)
    repetition_penalty: Any = None   # default 1
    presence_penalty: Any = None     # default 0
    frequency_penalty: Any = None    # default 0
    min_tokens: Any = None           # default 0 (needs eos_ids and generated)


@dataclass
class DecodeResult:
    tokens: Any
    logprobs: Optional[Any] = None
    top_ids: Optional[Any] = None
    top_logprobs: Optional[Any] = None


_INT_FIELDS = {"top_k", "min_tokens"}


def _rows(value, name, logits):
    if value is None:
        return None
    if isinstance(value, (bool, int, float)):
        from . import full, int32, float32
        dt = int32 if name in _INT_FIELDS else float32
        return full((logits.shape[0],), value, dtype=dt, device=logits.device)
    return value


def decode_step(logits, params: Params | dict | None, seeds, positions, history=None, history_lengths=None,
                logit_bias=None, banned=None, eos_ids=None, generated=None, return_logprobs=False,
                top_logprobs=0, stream=None) -> DecodeResult:
    """Penalties, temperature, filters and the seeded draw for a [B, V] batch whose rows
    each have their own parameters. Returns int32 token ids on the logits' device (and
    the chosen tokens' log-probabilities / the top-n log-probabilities when asked).
    Never synchronizes the host on CUDA: capturable in a graph (pass device arrays)."""
    if params is None:
        params = Params()
    if isinstance(params, dict):
        unknown = set(params) - {f.name for f in fields(Params)}
        if unknown:
            raise ValueError(f"params: unknown keys {sorted(unknown)}")
        params = Params(**params)
    kw = {f.name: _rows(getattr(params, f.name), f.name, logits) for f in fields(Params)}
    t, lp, ti, tl = _s.decode_step(logits, seeds, positions, history=history, history_lengths=history_lengths,
                                   logit_bias=logit_bias, banned=banned, eos_ids=eos_ids, generated=generated,
                                   return_logprobs=return_logprobs, top_logprobs=top_logprobs, stream=stream, **kw)
    return DecodeResult(t, lp, ti, tl)


__all__ = ["argmax", "topk", "apply_temperature", "apply_penalties", "apply_logit_bias", "ban_tokens",
           "apply_min_tokens", "top_k_filter", "top_p_filter", "min_p_filter", "typical_p_filter", "sample",
           "decode_step", "Params", "DecodeResult"]
