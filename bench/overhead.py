"""Host overhead of one small op from Python: 10,000 gk.add calls on 16-element float32 CUDA
arrays, wall time per call, with torch and CuPy in the same run when importable.

Usage: python bench/overhead.py [--out F] [--calls N]
"""
from __future__ import annotations

import sys

from common import gk, median, parse_args, per_call_us, print_table, record, require_cuda, write_results


def main():
    args = parse_args(__doc__, lambda p: p.add_argument("--calls", type=int, default=10_000))
    if not require_cuda():
        return 0
    a = gk.ones(16, dtype="float32", device="cuda")
    b = gk.ones(16, dtype="float32", device="cuda")
    repeats = max(5, args.rounds // 4)
    ours = per_call_us(lambda: gk.add(a, b), args.calls, gk.cuda.synchronize, repeats)
    peers = []
    if not args.no_peer:
        try:
            import torch
            if torch.cuda.is_available():
                ta, tb = torch.ones(16, device="cuda"), torch.ones(16, device="cuda")
                peers.append(("torch.add", median(per_call_us(lambda: torch.add(ta, tb), args.calls,
                                                             torch.cuda.synchronize, repeats))))
        except ImportError:
            pass
        try:
            import cupy
            ca, cb = cupy.ones(16, dtype=cupy.float32), cupy.ones(16, dtype=cupy.float32)
            peers.append(("cupy.add", median(per_call_us(lambda: cupy.add(ca, cb), args.calls,
                                                        cupy.cuda.Device().synchronize, repeats))))
        except ImportError:
            pass
        except Exception as e:  # CuPy present but unusable (no matching CUDA runtime)
            print(f"CuPy skipped: {e}")
    peer = "; ".join(f"{n} {v:.2f} us" for n, v in peers)
    rec = record("python_op_overhead", "16", "f32", "us", median(ours), peer,
                 peers[0][1] if peers else None, ours)
    print_table([rec])
    write_results(args.out, [rec])
    return 0


if __name__ == "__main__":
    sys.exit(main())
