"""Elementwise bandwidth: add and neg on 256 MiB operands (float32 and bfloat16), against the
measured device-to-device copy ceiling and torch in the same run.

TB/s = (bytes read + bytes written) / median time.  Usage: python bench/elementwise.py [--out F]
"""
from __future__ import annotations

import sys

from common import gk, median, parse_args, print_table, record, require_cuda, time_cuda, time_torch, write_results

OPERAND_BYTES = 1 << 28  # 256 MiB per operand: 2^26 float32 or 2^27 bfloat16 elements
SHAPE = str(OPERAND_BYTES)
DTYPES = {"f32": ("float32", 4), "bf16": ("bfloat16", 2)}


def tbs(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e12


def main():
    args = parse_args(__doc__)
    if not require_cuda():
        return 0
    try:
        import torch
        have_torch = not args.no_peer and torch.cuda.is_available()
    except ImportError:
        have_torch = False
    records = []
    # The copy ceiling: one read and one write of 256 MiB (float32, so the copy kernel can use
    # 16-byte accesses), by gpukit and by torch; the better of the two is the ceiling.
    n32 = OPERAND_BYTES // 4
    src = gk.full((n32,), 1.0, dtype="float32", device="cuda")
    dst = gk.empty((n32,), dtype="float32", device="cuda")
    copy_ms = time_cuda(lambda: gk.copy_into(dst, src), args.rounds)
    ceiling = tbs(2 * OPERAND_BYTES, median(copy_ms))
    peer, peer_v = "", None
    if have_torch:
        ts = torch.ones(n32, dtype=torch.float32, device="cuda")
        td = torch.empty_like(ts)
        peer, peer_v = "torch copy_", tbs(2 * OPERAND_BYTES, median(time_torch(lambda: td.copy_(ts), args.rounds)))
        ceiling = max(ceiling, peer_v)
        del ts, td
    records.append(record("copy", SHAPE, "f32", "TB/s", tbs(2 * OPERAND_BYTES, median(copy_ms)), peer, peer_v,
                          [tbs(2 * OPERAND_BYTES, m) for m in copy_ms]))
    src = dst = None  # free before the big operands
    for short, (dtype, itemsize) in DTYPES.items():
        n = OPERAND_BYTES // itemsize
        a = gk.arange(n, dtype="float32", device="cuda").astype(dtype)
        b = gk.full((n,), 0.5, dtype=dtype, device="cuda")
        ops = {
            "elementwise_add": (lambda: gk.add(a, b), 3 * OPERAND_BYTES, "torch.add",
                                lambda ta, tb: (lambda: torch.add(ta, tb))),
            "elementwise_neg": (lambda: gk.neg(a), 2 * OPERAND_BYTES, "torch.neg",
                                lambda ta, tb: (lambda: torch.neg(ta))),
        }
        if have_torch:
            tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
            ta = torch.arange(n, dtype=torch.float32, device="cuda").to(tdt)
            tb = torch.full((n,), 0.5, dtype=tdt, device="cuda")
        for name, (fn, nbytes, peer_name, tfn) in ops.items():
            ms = time_cuda(fn, args.rounds)
            peer, peer_v = "", None
            if have_torch:
                peer, peer_v = peer_name, tbs(nbytes, median(time_torch(tfn(ta, tb), args.rounds)))
            records.append(record(name, SHAPE, short, "TB/s", tbs(nbytes, median(ms)), peer, peer_v,
                                  [tbs(nbytes, m) for m in ms]))
        # correctness spot check: not timing zeros or garbage
        got = gk.add(a, b)[n - 3:].astype("float32").numpy().tolist()
        want = gk.arange(n - 3, n, dtype="float32").astype(dtype).astype("float32") + 0.5
        assert got == want.astype(dtype).astype("float32").numpy().tolist(), (got, want)
        a = b = None
        if have_torch:
            del ta, tb
    print_table(records)
    print(f"copy ceiling {ceiling:.3f} TB/s; ratios to it: " + ", ".join(
        f"{r['name']}/{r['dtype']} {r['gpukit'] / ceiling:.0%}" for r in records if r["name"] != "copy"))
    write_results(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
