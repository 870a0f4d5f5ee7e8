"""Op-table entries of the block-scaled FP8 GEMM, its quantizer and the mixture-of-experts ops
(format: tests/python/harness.py). Edge cases, bad input and the cuBLASLt paths are in
test_fp8_gemm.py and test_moe.py."""
import ml_dtypes
import numpy as np

import gpukit as gk
from harness import OpSpec


def _cdiv(a, b):
    return (a + b - 1) // b


def _scales(rows, cols, salt):
    """Fixed, varied positive scales (a wrong block index shows up in the result)."""
    i = np.arange(rows * cols, dtype=np.float64).reshape(rows, cols)
    return ((i * 7 + salt) % 11 + 1).astype(np.float32) * np.float32(0.0625)


def _fp8_block_call(x, w):
    m, k = int(np.prod(x.shape[:-1])), x.shape[-1]
    L = _cdiv(k, 128)
    xs = gk.asarray(_scales(m, L, 1).reshape(tuple(x.shape[:-1]) + (L,))).to(x.device.type)
    ws = gk.asarray(_scales(_cdiv(w.shape[0], 128), L, 5)).to(x.device.type)
    return gk.fp8_block_linear(x, w, xs, ws, out_dtype="float32")


def _fp8_block_ref(x, w):
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    L = _cdiv(k, 128)
    xs = _scales(x2.shape[0], L, 1).astype(np.float64)
    ws = np.repeat(_scales(_cdiv(w.shape[0], 128), L, 5).astype(np.float64), 128, axis=0)[: w.shape[0]]
    y = np.zeros((x2.shape[0], w.shape[0]))
    for b in range(L):
        sl = slice(b * 128, (b + 1) * 128)
        y += xs[:, b:b + 1] * ws[None, :, b] * (x2[:, sl] @ w[:, sl].T)
    return y.reshape(tuple(x.shape[:-1]) + (w.shape[0],))


def _fp8_block_plan(layout):
    return {
        "small": [((7, 200), None), ((130, 200), None)],
        "batched": [((2, 3, 256), None), ((9, 256), None)],
        "offset": [((8, 300), "offset1"), ((5, 300), None)],
        "one_row": [((1, 128), None), ((256, 128), None)],
    }.get(layout)


def _quant_ref(a, rows_per_block):
    a32 = np.asarray(a, dtype=np.float32).reshape(-1, a.shape[-1])
    R, C = a32.shape
    s = np.ones((_cdiv(R, rows_per_block), _cdiv(C, 128)), np.float32)
    q = np.zeros((R, C))
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            blk = a32[i * rows_per_block:(i + 1) * rows_per_block, j * 128:(j + 1) * 128]
            sc = np.float32(np.max(np.abs(blk))) / np.float32(448.0)
            sc = sc if sc > 0 and np.isfinite(sc) else np.float32(1.0)
            s[i, j] = sc
            q[i * rows_per_block:(i + 1) * rows_per_block, j * 128:(j + 1) * 128] = \
                (blk / sc).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    if rows_per_block == 1:
        return q.reshape(a.shape), s.reshape(tuple(a.shape[:-1]) + (s.shape[-1],)).astype(np.float64)
    return q.reshape(a.shape), s.astype(np.float64)


def _quant_plan(layout):
    return {
        "small": [((7, 200), None)],
        "batched": [((2, 3, 300), None)],
        "offset": [((5, 256), "offset1")],
        "transposed": [((130, 9), "T")],
    }.get(layout)


OPS = [
    OpSpec("fp8_block_linear", _fp8_block_call, _fp8_block_ref, nin=2, plan=_fp8_block_plan,
           layouts=("small", "batched", "offset", "one_row"), dtypes=("float8_e4m3fn",),
           out_dtype=lambda dt: "float32", tol={"float32": (2e-5, 1e-4)}, low=-2, high=2),
    OpSpec("quantize_fp8_blocks", lambda a: gk.quantize_fp8_blocks(a, block_rows=1), lambda a: _quant_ref(a, 1),
           nin=1, plan=_quant_plan, layouts=("small", "batched", "offset", "transposed"),
           dtypes=("float32", "bfloat16"), out_dtype=lambda dt: ("float8_e4m3fn", "float32"), exact=True,
           bitwise_cpu=True, low=-5, high=5),
    OpSpec("quantize_fp8_blocks", lambda a: gk.quantize_fp8_blocks(a, block_rows=128), lambda a: _quant_ref(a, 128),
           nin=1, plan=lambda layout: {"small": [((130, 200), None)], "transposed": [((300, 140), "T")]}.get(layout),
           layouts=("small", "transposed"), dtypes=("float32", "bfloat16"), id="quantize_fp8_blocks_128x128",
           out_dtype=lambda dt: ("float8_e4m3fn", "float32"), exact=True, bitwise_cpu=True, low=-5, high=5),
]


# ---- mixture of experts ----

def _gating_ref(logits, k=2):
    T, E = logits.shape
    ids = np.array([sorted(range(E), key=lambda i: (-logits[t, i], i))[:k] for t in range(T)]).reshape(T, k)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    w = np.take_along_axis(p, ids, 1)
    return ids.astype(np.float64), w / w.sum(1, keepdims=True)


OPS.append(OpSpec("moe_topk_gating", lambda lg: gk.moe_topk_gating(lg, 2), _gating_ref, nin=1,
                  plan=lambda layout: {"small": [((7, 8), None)], "transposed": [((8, 13), "T")],
                                       "offset": [((40, 16), "offset1")], "one_row": [((1, 3), None)]}.get(layout),
                  layouts=("small", "transposed", "offset", "one_row"), dtypes=("float32", "bfloat16"),
                  out_dtype=lambda dt: ("int32", "float32"), exact=(True, False),
                  tol={"float32": (1e-5, 1e-6)}, low=-4, high=4))

_IDS = np.array([[1, 3], [0, 1], [3, 2], [1, 0], [2, 1], [1, 3], [0, 2]])  # 7 tokens, top-2 of 4 (expert 1 crowded)


def _permute_ref(x, ids):
    T, k = ids.shape
    order = sorted((int(ids[t, j]), t * k + j) for t in range(T) for j in range(k))
    pos = np.zeros(T * k)
    for r, (_, s) in enumerate(order):
        pos[s] = r
    tok = np.array([s // k for _, s in order], dtype=np.float64)
    off = np.concatenate([[0], np.cumsum(np.bincount(ids.reshape(-1).astype(np.int64), minlength=4))])
    return x[tok.astype(np.int64)], off.astype(np.float64), pos.reshape(T, k), tok


OPS.append(OpSpec("moe_permute", lambda x, ids: gk.moe_permute(x, ids, 4), _permute_ref, nin=2,
                  plan=lambda layout: {"small": [((7, 5), None), ((7, 2), None, _IDS)],
                                       "offset": [((8, 33), "offset1"), ((7, 2), None, _IDS)]}.get(layout),
                  layouts=("small", "offset"), dtypes=("bfloat16", "float32"), in_dtypes=lambda dt: (dt, "int32"),
                  exact=True, bitwise_cpu=True))

_POS = np.array([[5, 0], [9, 2], [13, 1], [3, 12], [4, 11], [6, 10], [7, 8]])  # a permutation of 14 rows


def _unpermute_ref(y, pos, w):
    return np.einsum("tk,tkh->th", w, y[pos.astype(np.int64)])


OPS.append(OpSpec("moe_unpermute", lambda y, pos, w: gk.moe_unpermute(y, pos, w), _unpermute_ref, nin=3,
                  plan=lambda layout: {"small": [((14, 6), None), ((7, 2), None, _POS), ((7, 2), None)],
                                       "wide": [((14, 300), None), ((7, 2), None, _POS), ((7, 2), None)]}.get(layout),
                  layouts=("small", "wide"), dtypes=("float32", "bfloat16"),
                  in_dtypes=lambda dt: (dt, "int32", "float32"), bitwise_cpu=True, low=0, high=1))

_OFF = np.array([0, 3, 3, 10, 12])  # 4 experts (the second empty); rows 12..13 belong to none: zeros


def _grouped_ref(x, w, off):
    y = np.zeros((x.shape[0], w.shape[1]))
    o = off.astype(np.int64)
    for e in range(w.shape[0]):
        y[o[e]:o[e + 1]] = x[o[e]:o[e + 1]] @ w[e].T
    return y


def _grouped_plan(layout):
    return {"small": [((14, 9), None), ((4, 5, 9), None), ((5,), None, _OFF)],
            "wide": [((14, 136), None), ((4, 70, 136), None), ((5,), None, _OFF)]}.get(layout)


# float32 (and K % 8 != 0) runs the CUDA-core kernel: the CPU's fma order, bit for bit; bf16/f16
# with K % 8 == 0 the tensor-core kernel: within fp32 accuracy of the CPU.
OPS.append(OpSpec("moe_grouped_gemm", lambda x, w, off: gk.moe_grouped_gemm(x, w, off, out_dtype="float32"),
                  _grouped_ref, nin=3, plan=_grouped_plan, layouts=("small", "wide"), dtypes=("float32",),
                  in_dtypes=lambda dt: (dt, dt, "int32"), out_dtype=lambda dt: "float32", bitwise_cpu=True,
                  tol={"float32": (1e-5, 1e-5)}, low=-1, high=1))
OPS.append(OpSpec("moe_grouped_gemm", lambda x, w, off: gk.moe_grouped_gemm(x, w, off, out_dtype="float32"),
                  _grouped_ref, nin=3, plan=_grouped_plan, layouts=("small", "wide"), dtypes=("bfloat16", "float16"),
                  in_dtypes=lambda dt: (dt, dt, "int32"), out_dtype=lambda dt: "float32", id="moe_grouped_gemm_half",
                  tol={"float32": (1e-5, 1e-5)}, low=-1, high=1))
