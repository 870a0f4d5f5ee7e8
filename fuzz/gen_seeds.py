"""Writes the fuzzers' seed corpus: small valid safetensors and GGUF files (and a
few near-misses) under <out>/safetensors and <out>/gguf.

    python fuzz/gen_seeds.py fuzz/corpus

Uses numpy, and the `gguf` package when installed (else GGUF seeds are written
by hand)."""
import json
import os
import struct
import sys

import numpy as np


def st_bytes(tensors, metadata=None):
    hdr, data, off = {}, b"", 0
    if metadata:
        hdr["__metadata__"] = metadata
    for name, (dt, shape, raw) in tensors.items():
        hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        data += raw
        off += len(raw)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    rng = np.random.default_rng(0)
    seeds = {}
    dts = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
           "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
    for dt, sz in dts.items():
        seeds[f"one_{dt}"] = st_bytes({"x": (dt, (2, 3), rng.integers(0, 2 if dt == "BOOL" else 256, 6 * sz,
                                                                       dtype=np.uint8).tobytes())})
    seeds["multi"] = st_bytes({"a": ("F32", (4,), bytes(16)), "b": ("U8", (3, 1), b"abc"),
                               "empty": ("F16", (0, 5), b""), "scalar": ("I32", (), b"\x01\0\0\0")},
                              metadata={"format": "pt", "k\u00e9": "v\\\"\n"})
    seeds["empty_header"] = st_bytes({})
    return seeds


def gguf_by_hand():
    def s(x):
        x = x.encode()
        return struct.pack("<Q", len(x)) + x
    kv = s("general.architecture") + struct.pack("<I", 8) + s("llama")
    kv += s("arr") + struct.pack("<IIQ", 9, 5, 2) + struct.pack("<ii", -1, 2)
    ti = s("w") + struct.pack("<IqqIQ", 2, 32, 1, 8, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 2) + kv + ti
    head += bytes(-len(head) % 32)
    return head + struct.pack("<e", 0.5) + bytes(range(32))


def gguf_seeds(tmp):
    seeds = {"by_hand": gguf_by_hand()}
    try:
        import gguf
    except ImportError:
        return seeds
    rng = np.random.default_rng(1)
    Q = gguf.GGMLQuantizationType
    types = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
    for name in types:
        qt = Q[name]
        block, tsize = gguf.GGML_QUANT_SIZES[qt]
        path = os.path.join(tmp, f"{name}.gguf")
        w = gguf.GGUFWriter(path, arch="llama")
        w.add_uint32("llama.context_length", 64)
        w.add_array("tokenizer.ggml.tokens", ["a", "b", "\u00e9"])
        w.add_array("nested", [[1, 2], [3]])
        w.add_float32("f", 0.5)
        w.add_bool("b", True)
        n = max(block, 32)
        if name in ("F32", "F16"):
            w.add_tensor("t", rng.standard_normal((2, n)).astype(np.float32 if name == "F32" else np.float16))
        else:
            raw = rng.integers(0, 256, (2, n // block * tsize), dtype=np.uint8)
            w.add_tensor("t", raw, raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(path, "rb") as f:
            seeds[name] = f.read()
        os.remove(path)
    return seeds


def main(out):
    import tempfile
    for kind, seeds in (("safetensors", safetensors_seeds()), ("gguf", gguf_seeds(tempfile.mkdtemp()))):
        d = os.path.join(out, kind)
        os.makedirs(d, exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        print(f"{len(seeds)} {kind} seeds in {d}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus"))
