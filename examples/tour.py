"""A short tour of gpukit's array API (the README's main job)."""
import numpy as np

import gpukit as gk


def main():
    dev = "cuda" if gk.cuda.is_available() else "cpu"
    print(f"gpukit {gk.__version__}: devices {[str(d) for d in gk.devices()]}, running on {dev}")
    if dev == "cuda":
        p = gk.cuda.get_device_properties(dev)
        print(f"  {p['name']}: {p['multiprocessors']} SMs, {p['total_memory'] / 2**30:.1f} GiB")

    a = gk.arange(12, dtype=gk.float32, device=dev).reshape(3, 4)
    print("a =", repr(a))
    print("a.T (a view, no copy):", a.T.shape, "strides", a.T.strides)
    print("a[:, ::2] =", a[:, ::2].numpy().tolist())
    b = gk.asarray(np.linspace(-1, 1, 4, dtype=np.float32), device=dev)
    print("a * b + 1 (broadcast) =", (a * b + 1).numpy().tolist())
    print("silu(b) =", np.round(gk.silu(b).numpy(), 4).tolist())
    h = a.astype(gk.bfloat16)
    print("a as bfloat16:", repr(h[0]))
    f8 = gk.asarray(np.array([0.1, 1.0, 500.0, -1e6], dtype=np.float32), device=dev).astype(gk.float8_e4m3fn)
    print("float8_e4m3fn saturates:", f8.astype(gk.float32).numpy().tolist())
    print("where(a > 5, a, 0) =", gk.where(a > 5, a, 0.0).numpy().tolist())
    if hasattr(gk, "sum"):
        print("sum over axis 1 =", gk.sum(a, axis=1).numpy().tolist())
    if hasattr(gk, "matmul"):
        print("a @ a.T =", (gk.matmul(a, a.T)).numpy().tolist())
    try:
        a + gk.ones((5,), device=dev)
    except ValueError as e:
        print("clear errors:", e)
    if dev == "cpu":
        print("memory (cpu):", gk.memory_stats("cpu")["allocated"], "bytes in live arrays")
    else:
        s = gk.memory_stats(dev)
        print(f"caching allocator: {s['allocated']} B in use, {s['reserved']} B reserved, hits {s['hits']}")


if __name__ == "__main__":
    main()
