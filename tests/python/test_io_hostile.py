"""Hostile input: a generated corpus of malformed safetensors and GGUF files.
Each must raise gk.io.FormatError (a ValueError) naming the problem, quickly,
without crashing or allocating much more than the file's size. Also replays the
fuzzers' regression inputs (fuzz/regressions/)."""
import json
import os
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

import gpukit as gk

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_format_error_is_value_error():
    assert issubclass(gk.io.FormatError, ValueError)
    assert gk.io.FormatError is gk._C.FormatError is gk._C.io.FormatError


# ---- safetensors corpus ---------------------------------------------------------

def st_file(header, data=b"", length=None):
    h = header if isinstance(header, bytes) else (header if isinstance(header, str) else json.dumps(header)).encode()
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def T(dtype="F32", shape=(2,), offs=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offs)}


D8 = bytes(8)
ST_CASES = {
    "empty": (b"", "truncated"),
    "short_length": (b"\x05\x00\x00", "truncated"),
    "header_over_limit": (st_file("{}", length=100_000_001), "exceeds the limit"),
    "header_negative_length": (st_file("{}", length=2**64 - 1), "exceeds the limit"),
    "header_past_end": (st_file("{}", length=1000), "exceeds the file"),
    "header_zero": (st_file(b"", length=0), "too small"),
    "not_object": (st_file("[1, 2]"), "JSON object"),
    "bad_utf8": (st_file(b'{"a\xc3\x28":1}'), "UTF-8"),
    "overlong_utf8": (st_file(b'{"\xc0\xaf":1}'), "UTF-8"),
    "surrogate_utf8": (st_file(b'{"\xed\xa0\x80":1}'), "UTF-8"),
    "lone_surrogate_escape": (st_file('{"\\ud800": 1}'), "surrogate"),
    "trailing_comma": (st_file('{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},}', D8), "trailing"),
    "single_quotes": (st_file("{'a': 1}"), "string"),
    "unterminated": (st_file('{"a'), "unterminated"),
    "control_char": (st_file('{"a\x01": 1}'), "control"),
    "nan": (st_file('{"x": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 0]}}'), "integer"),
    "garbage_after": (st_file(json.dumps({"a": T()}) + " x", D8), "after"),
    "deep_nesting": (st_file('{"a": {"dtype": "F32", "junk": ' + "[" * 5000 + "]" * 5000 + "}}"), "nesting"),
    "duplicate_tensor": (st_file('{"a": %s, "a": %s}' % (json.dumps(T()), json.dumps(T())), D8), "duplicate"),
    "duplicate_field": (st_file('{"a": {"dtype": "F32", "dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', D8),
                        "duplicate"),
    "unknown_dtype": (st_file({"a": T(dtype="F4")}, D8), "unsupported dtype"),
    "dtype_not_string": (st_file('{"a": {"dtype": 4, "shape": [2], "data_offsets": [0, 8]}}', D8), "string"),
    "negative_dim": (st_file('{"a": {"dtype": "U8", "shape": [-8], "data_offsets": [0, 8]}}', D8), "negative"),
    "float_dim": (st_file('{"a": {"dtype": "U8", "shape": [8.0], "data_offsets": [0, 8]}}', D8), "integer"),
    "huge_dim": (st_file('{"a": {"dtype": "U8", "shape": [99999999999999999999], "data_offsets": [0, 8]}}', D8),
                 "too large"),
    "dim_over_int64": (st_file({"a": T("U8", (2**63,), (0, 8))}, D8), "int64"),
    "dims_overflow": (st_file({"a": T("F32", (2**32, 2**32), (0, 8))}, D8), "too many elements"),
    "bytes_overflow": (st_file({"a": T("F64", (2**61,), (0, 8))}, D8), "64 bits"),
    "offsets_three": (st_file({"a": T(offs=(0, 4, 8))}, D8), "exactly 2"),
    "offsets_one": (st_file({"a": T(offs=(0,))}, D8), "exactly 2"),
    "offsets_reversed": (st_file({"a": T("U8", (0,), (8, 0))}, D8), "end before"),
    "offsets_past_end": (st_file({"a": T("U8", (16,), (0, 16))}, D8), "past the end"),
    "offsets_negative": (st_file('{"a": {"dtype": "U8", "shape": [8], "data_offsets": [-8, 0]}}', D8), "negative"),
    "size_mismatch": (st_file({"a": T("F32", (3,), (0, 8))}, D8), "needs 12"),
    "overlap": (st_file({"a": T("F32", (2,), (0, 8)), "b": T("F32", (1,), (4, 8))}, D8), "overlaps"),
    "gap": (st_file({"a": T("F32", (1,), (4, 8))}, D8), "gap"),
    "trailing_bytes": (st_file({"a": T("F32", (1,), (0, 4))}, D8), "trailing bytes"),
    "data_without_tensors": (st_file("{}", D8), "trailing bytes"),
    "missing_shape": (st_file('{"a": {"dtype": "F32", "data_offsets": [0, 8]}}', D8), "missing 'shape'"),
    "missing_offsets": (st_file('{"a": {"dtype": "F32", "shape": [2]}}', D8), "missing 'data_offsets'"),
    "missing_dtype": (st_file('{"a": {"shape": [2], "data_offsets": [0, 8]}}', D8), "missing 'dtype'"),
    "tensor_not_object": (st_file('{"a": [1]}'), "object"),
    "metadata_not_string": (st_file('{"__metadata__": {"k": 1}}'), "not a string"),
    "metadata_not_object": (st_file('{"__metadata__": "x"}'), "object"),
    "metadata_duplicate": (st_file('{"__metadata__": {"k": "a", "k": "b"}}'), "duplicate"),
}


def check(path, loader, match):
    t0 = time.perf_counter()
    with pytest.raises(gk.io.FormatError, match=match):
        loader(path)
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("name", sorted(ST_CASES))
def test_safetensors_malformed(tmp_path, name):
    data, match = ST_CASES[name]
    p = tmp_path / f"{name}.safetensors"
    p.write_bytes(data)
    check(p, gk.io.SafeTensors, match)


def test_safetensors_truncated_everywhere(tmp_path):
    good = st_file({"__metadata__": {"k": "v"}, "a": T("F32", (2,), (0, 8)), "b": T("I16", (3,), (8, 14))},
                   bytes(range(14)))
    p = tmp_path / "ok.safetensors"
    p.write_bytes(good)
    assert len(gk.io.SafeTensors(p)) == 2
    for n in range(len(good)):
        p.write_bytes(good[:n])
        with pytest.raises(gk.io.FormatError):
            gk.io.SafeTensors(p)
    p.write_bytes(good + b"\0")
    with pytest.raises(gk.io.FormatError, match="trailing"):
        gk.io.SafeTensors(p)


# ---- GGUF corpus ---------------------------------------------------------------------

def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return gstr(key) + struct.pack("<I", vtype) + payload


def tinfo(name, dims, ttype=0, off=0):
    return gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<q", d) for d in dims) + \
        struct.pack("<IQ", ttype, off)


def gguf_file(kvs=(), tinfos=(), data=b"", version=3, n_kv=None, n_t=None, align=32, magic=b"GGUF"):
    head = magic + struct.pack("<IQQ", version, len(tinfos) if n_t is None else n_t, len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs) + b"".join(tinfos)
    head += bytes(-len(head) % align)
    return head + data


def nested(depth):
    p = b""
    for _ in range(depth):
        p += struct.pack("<IQ", 9, 1)
    return kv("deep", 9, p + struct.pack("<IQ", 0, 0))


F32x8 = bytes(32)
ARCH = kv("general.architecture", 8, gstr("llama"))
GG_CASES = {
    "empty": (b"", "truncated"),
    "wrong_magic": (gguf_file(magic=b"GGML"), "magic"),
    "version_1": (gguf_file(version=1), "version 1"),
    "version_4": (gguf_file(version=4), "unsupported GGUF version 4"),
    "version_0": (gguf_file(version=0), "unsupported GGUF version 0"),
    "big_endian": (gguf_file(version=0x03000000), "big-endian"),
    "kv_count_huge": (gguf_file(n_kv=2**63), "metadata count"),
    "kv_count_past_end": (gguf_file([ARCH], n_kv=2, align=1), "truncated"),
    "empty_key": (gguf_file([kv("", 4, bytes(4))]), "empty metadata key"),
    "key_not_utf8": (gguf_file([kv(b"k\xff", 4, bytes(4))]), "UTF-8"),
    "tensor_name_not_utf8": (gguf_file([], [tinfo(b"t\xc3", [8])], F32x8), "UTF-8"),
    "key_too_long": (gguf_file([kv("k" * 70000, 4, bytes(4))]), "65535"),
    "tensor_count_huge": (gguf_file(n_t=2**64 - 1), "tensor count"),
    "key_length_negative": (gguf_file([struct.pack("<Q", 2**64 - 1) + b"x" * 16]), "string length"),
    "key_length_over_1gib": (gguf_file([struct.pack("<Q", 2**30 + 1) + b"x" * 16]), "1 GiB"),
    "string_past_end": (gguf_file([kv("s", 8, struct.pack("<Q", 1000) + b"abc")]), "exceeds"),
    "unknown_value_type": (gguf_file([kv("x", 13, b"\0" * 8)]), "unknown metadata value type 13"),
    "unknown_value_type_max": (gguf_file([kv("x", 2**32 - 1, b"\0" * 8)]), "unknown metadata value type"),
    "unknown_elem_type": (gguf_file([kv("x", 9, struct.pack("<IQ", 99, 1) + b"\0" * 8)]), "unknown metadata"),
    "array_over_2_30": (gguf_file([kv("x", 9, struct.pack("<IQ", 0, 2**30 + 1))]), "2\\^30"),
    "array_negative_count": (gguf_file([kv("x", 9, struct.pack("<IQ", 0, 2**64 - 1))]), "2\\^30"),
    "array_past_end": (gguf_file([kv("x", 9, struct.pack("<IQ", 10, 2**29) + b"\0" * 64)]), "needs at least"),
    "string_array_past_end": (gguf_file([kv("x", 9, struct.pack("<IQ", 8, 2**30) + b"\0" * 64)]), "needs at least"),
    "nested_array_past_end": (gguf_file([kv("x", 9, struct.pack("<IQ", 9, 2**28) + b"\0" * 64)]), "needs at least"),
    "deeply_nested": (gguf_file([nested(100)]), "nested deeper"),
    "nested_9": (gguf_file([nested(9)]), "nested deeper"),
    "duplicate_key": (gguf_file([ARCH, ARCH]), "duplicate metadata key"),
    "alignment_zero": (gguf_file([kv("general.alignment", 4, struct.pack("<I", 0))]), "power of two"),
    "alignment_three": (gguf_file([kv("general.alignment", 4, struct.pack("<I", 3))]), "power of two"),
    "alignment_string": (gguf_file([kv("general.alignment", 8, gstr("32"))]), "uint32"),
    "five_dims": (gguf_file([], [tinfo("t", [1, 1, 1, 1, 8])], F32x8), "at most 4"),
    "many_dims": (gguf_file([], [struct.pack("<Q", 1) + b"t" + struct.pack("<I", 2**31)]), "at most 4"),
    "zero_dim": (gguf_file([], [tinfo("t", [8, 0])], F32x8), "zero"),
    "negative_dim": (gguf_file([], [tinfo("t", [8, -1])], F32x8), "negative"),
    "dims_overflow": (gguf_file([], [tinfo("t", [2**32, 2**32])], F32x8), "overflows 64 bits"),
    "dims_overflow_3": (gguf_file([], [tinfo("t", [2**21, 2**21, 2**21])], F32x8), "overflows 64 bits"),
    "bytes_overflow": (gguf_file([], [tinfo("t", [2**62], ttype=0)], F32x8), "overflows 64 bits"),
    "unknown_tensor_type": (gguf_file([], [tinfo("t", [8], ttype=1000)], F32x8), "unknown tensor type 1000"),
    "removed_tensor_type": (gguf_file([], [tinfo("t", [32], ttype=4)], F32x8), "unknown tensor type 4"),
    "row_not_block_multiple": (gguf_file([], [tinfo("t", [31], ttype=2)], F32x8), "block size"),
    "offset_misaligned": (gguf_file([], [tinfo("t", [4], off=4)], F32x8), "alignment"),
    "offset_past_end": (gguf_file([], [tinfo("t", [8], off=64)], F32x8), "past the end"),
    "offset_wraps": (gguf_file([], [tinfo("t", [8], off=2**64 - 32)], F32x8), "past the end"),
    "size_past_end": (gguf_file([], [tinfo("t", [9])], F32x8), "past the end"),
    "overlapping": (gguf_file([], [tinfo("a", [8]), tinfo("b", [4], off=0)], F32x8), "overlaps"),
    "overlapping_2": (gguf_file([], [tinfo("a", [8], off=32), tinfo("b", [16], off=0)], F32x8 * 2), "overlaps"),
    "duplicate_tensor": (gguf_file([], [tinfo("a", [4]), tinfo("a", [4], off=32)], F32x8 * 2), "duplicate tensor"),
    "tensor_info_truncated": (gguf_file([], [tinfo("a", [4])[:-3]], align=1), "truncated"),
    "data_missing": (gguf_file([], [tinfo("a", [4])], align=1)[:-1], "truncated|past the end"),
}


@pytest.mark.parametrize("name", sorted(GG_CASES))
def test_gguf_malformed(tmp_path, name):
    data, match = GG_CASES[name]
    p = tmp_path / f"{name}.gguf"
    p.write_bytes(data)
    check(p, gk.io.GGUF, match)


def test_gguf_nesting_limit_allows_8(tmp_path):
    p = tmp_path / "n8.gguf"
    p.write_bytes(gguf_file([nested(7)]))
    v = gk.io.GGUF(p).metadata["deep"]
    for _ in range(7):
        v = v[0]
    assert v == []


def valid_gguf(path):
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])
    w.add_array("nested", [[1, 2], [3]])
    w.add_float64("f", 1.5)
    w.add_tensor("a", np.arange(8, dtype=np.float32))
    q = gguf.quants.quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("b", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def test_gguf_truncated_everywhere(tmp_path):
    p = tmp_path / "ok.gguf"
    good = valid_gguf(p)
    g = gk.io.GGUF(p)
    end = g._g.data_start + max(t.offset + t.nbytes for t in g.tensors.values())
    del g
    for n in range(end):
        p.write_bytes(good[:n])
        with pytest.raises(gk.io.FormatError):
            gk.io.GGUF(p)


def test_gguf_flipped_bytes_never_crash(tmp_path):
    """Every single-byte corruption of a valid file loads or raises FormatError."""
    p = tmp_path / "ok.gguf"
    good = valid_gguf(p)
    rng = np.random.default_rng(0)
    for pos in range(min(len(good), 700)):
        for val in (0, 0xFF, int(rng.integers(0, 256))):
            b = bytearray(good)
            b[pos] = val
            p.write_bytes(bytes(b))
            try:
                g = gk.io.GGUF(p)
                g.metadata
                for t in g.tensors:
                    g.raw(t)
                    if t in ("a", "b"):
                        try:
                            g.dequantize(t)
                        except ValueError:
                            pass
            except gk.io.FormatError:
                pass


MEMORY_SCRIPT = r"""
import resource, struct, sys
sys.path.insert(0, sys.argv[1])
import gpukit as gk
path = sys.argv[2]
def rss(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
def g(s): b = s.encode(); return struct.pack("<Q", len(b)) + b
N = 4 << 20
files = {
  # arrays of empty arrays (12 bytes each), empty strings (8 bytes each), bytes
  "nested": struct.pack("<IQ", 9, N // 12 - 4) + struct.pack("<IQ", 0, 0) * (N // 12 - 4),
  "strings": struct.pack("<IQ", 8, N // 8 - 4) + struct.pack("<Q", 0) * (N // 8 - 4),
  "u8": struct.pack("<IQ", 0, N) + bytes(N),
}
base = rss()
for name, payload in files.items():
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + g("k") + struct.pack("<I", 9) + payload
    open(path, "wb").write(data)
    gk.io.GGUF(path)
    grown = rss() - base
    print(name, len(data), grown)
    assert grown < 20 * len(data) + (16 << 20), (name, grown)
"""


def test_gguf_memory_bounded_by_file_size(tmp_path):
    r = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, os.path.join(ROOT, "python"), str(tmp_path / "m.gguf")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


# ---- fuzzer regressions -------------------------------------------------------------------

def regression_files():
    """Crash inputs kept from fuzzing (fuzz/regressions/) and the seed corpus."""
    out = []
    for sub in ("regressions", "corpus"):
        for kind in ("safetensors", "gguf"):
            d = os.path.join(ROOT, "fuzz", sub, kind)
            if os.path.isdir(d):
                out += [(kind, os.path.join(d, f)) for f in sorted(os.listdir(d))]
    return out


@pytest.mark.parametrize("kind,path", regression_files() or [pytest.param(None, None, marks=pytest.mark.skip)])
def test_fuzz_regressions(kind, path):
    loader = gk.io.SafeTensors if kind == "safetensors" else gk.io.GGUF
    try:
        f = loader(path)
    except gk.io.FormatError:
        return
    for name in list(f.keys()):
        if kind == "safetensors":
            gk.to_numpy(f[name])
        else:
            f.raw(name)
            try:
                f.dequantize(name)
            except ValueError:
                pass
