"""GGUF: metadata of every type, tensor infos, raw blocks, and dequantization
bit-exact against the reference of the `gguf` package (llama.cpp project), on
files written with that package; and the default model (SmolLM2-135M-Instruct)."""
import math

import ml_dtypes
import numpy as np
import pytest

import gpukit as gk

try:
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFValueType as V
except ImportError:  # pragma: no cover
    gguf = None

needs_gguf = pytest.mark.skipif(gguf is None, reason="the gguf package is not installed")

FORMATS = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
QUANTIZABLE = {"BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}
# Byte offsets of the fp16 scale fields inside one block.
FP16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
               "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_blocks(fmt, rows, n, rng):
    """Random but valid block bytes: random quants, finite fp16 scales."""
    block, tsize = gguf.GGML_QUANT_SIZES[Q[fmt]]
    raw = rng.integers(0, 256, (rows, n // block, tsize), dtype=np.uint8)
    for off in FP16_FIELDS[fmt]:
        scales = (rng.standard_normal((rows, n // block)) * 0.05).astype(np.float16)
        raw[:, :, off:off + 2] = scales.view(np.uint8).reshape(rows, n // block, 2)
    return raw.reshape(rows, -1)


def quantized(fmt, values):
    if fmt == "F32":
        return values.astype(np.float32)
    if fmt == "F16":
        return values.astype(np.float16)
    return gguf.quants.quantize(values, Q[fmt])


def write_gguf(path, tensors, kv=None, alignment=None):
    """tensors: list of (name, array, fmt). Plain float arrays are written as is,
    uint8 arrays as the raw blocks of `fmt`."""
    w = gguf.GGUFWriter(str(path), arch="llama")
    if alignment:
        w.add_custom_alignment(alignment)
    for k, (val, vt, sub) in (kv or {}).items():
        w.add_key_value(k, val, vt, sub_type=sub)
    for name, arr, fmt in tensors:
        if arr.dtype == np.uint8:
            w.add_tensor(name, arr, raw_dtype=Q[fmt])
        else:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def bits32(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@needs_gguf
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("source", ["quantize", "random"])
def test_dequantize_bit_exact(tmp_path, fmt, source):
    rng = np.random.default_rng(abs(hash((fmt, source))) % 2**32)
    block, _ = gguf.GGML_QUANT_SIZES[Q[fmt]]
    n = block * 3 if block > 1 else 37  # odd sizes for the float formats
    shape = (3, 5, n)
    if source == "quantize":
        if fmt not in QUANTIZABLE | {"F32", "F16"}:
            pytest.skip(f"gguf cannot quantize {fmt}")
        values = (rng.standard_normal(shape) * rng.uniform(0.01, 3)).astype(np.float32)
        values[0, 0, :4] = [0, -0.0, 1e-8, -7.25]
        data = quantized(fmt, values)
        if fmt == "BF16":
            data = data.view(np.uint8)
    else:
        if fmt in ("F32", "F16", "BF16"):
            pytest.skip("plain float formats are covered by the quantize source")
        data = random_blocks(fmt, 15, n, rng).reshape(3, 5, -1)
    p = tmp_path / f"{fmt}.gguf"
    write_gguf(p, [("t", data, fmt)])
    g = gk.io.GGUF(p)
    info = g.tensors["t"]
    assert info.type == fmt
    assert info.shape == shape
    assert info.dims == shape[::-1]
    raw = gk.to_numpy(g.raw("t"))
    ref_raw = np.ascontiguousarray(data).view(np.uint8).reshape(raw.shape)
    assert raw.tobytes() == ref_raw.tobytes()
    ref = gguf.quants.dequantize(raw.reshape(15, -1), Q[fmt]).reshape(shape)
    ours = gk.to_numpy(g.dequantize("t"))
    assert ours.dtype == np.float32 and ours.shape == shape
    assert np.array_equal(bits32(ours), bits32(ref)), fmt
    ours16 = gk.to_numpy(g.dequantize("t", dtype="bfloat16"))
    assert ours16.dtype == ml_dtypes.bfloat16
    assert np.array_equal(ours16.view(np.uint16), ref.astype(ml_dtypes.bfloat16).view(np.uint16))


@needs_gguf
def test_metadata_all_types(tmp_path):
    kv = {
        "u8": (200, V.UINT8, None), "i8": (-100, V.INT8, None), "u16": (60000, V.UINT16, None),
        "i16": (-30000, V.INT16, None), "u32": (4_000_000_000, V.UINT32, None), "i32": (-2_000_000_000, V.INT32, None),
        "f32": (0.1, V.FLOAT32, None), "b": (True, V.BOOL, None), "s": ("héllo 🦙", V.STRING, None),
        "u64": (2**64 - 1, V.UINT64, None), "i64": (-2**63, V.INT64, None), "f64": (math.pi, V.FLOAT64, None),
        "arr_u8": ([1, 2, 255], V.ARRAY, V.UINT8), "arr_i16": ([-5, 7], V.ARRAY, V.INT16),
        "arr_f32": ([0.5, -1.25, 3e38], V.ARRAY, V.FLOAT32), "arr_f64": ([1e300, -2.5], V.ARRAY, V.FLOAT64),
        "arr_b": ([True, False, True], V.ARRAY, V.BOOL), "arr_s": (["a", "", "ü€"], V.ARRAY, V.STRING),
        "arr_u64": ([2**64 - 1, 0], V.ARRAY, V.UINT64), "arr_i64": ([-2**63, 5], V.ARRAY, V.INT64),
        "nested": ([[1, 2], [3], [4, 5, 6]], V.ARRAY, None),
        "nested_s": ([["x", "y"], ["z"]], V.ARRAY, None),
        "deep": ([[[[1]]], [[[2, 3]]]], V.ARRAY, None),
    }
    p = tmp_path / "meta.gguf"
    write_gguf(p, [("w", np.ones((2, 4), np.float32), "F32")], kv=kv)
    g = gk.io.GGUF(p)
    m = g.metadata
    assert m["general.architecture"] == "llama"
    for k, (val, vt, sub) in kv.items():
        if vt == V.FLOAT32:
            val = float(np.float32(val))
        if sub == V.FLOAT32:
            val = [float(np.float32(x)) for x in val]
        assert m[k] == val, k
        assert type(m[k]) is type(val), k
    assert g.metadata_type("arr_s") == "array[string]"
    assert g.metadata_type("u16") == "uint16"
    # Same values as the reference reader.
    r = gguf.GGUFReader(str(p))
    for name, field in r.fields.items():
        if name.startswith("GGUF."):
            continue
        ref = field.contents()
        if name in ("nested", "nested_s", "deep"):
            continue  # the reference reader flattens nested arrays
        assert m[name] == ref, name
    assert list(m)[:2] == ["general.architecture", "u8"]  # file order


@needs_gguf
def test_v2_and_alignment(tmp_path):
    vals = np.arange(64, dtype=np.float32).reshape(2, 32)
    p = tmp_path / "a.gguf"
    write_gguf(p, [("a", vals, "F32"), ("b", vals[:1, :3].copy(), "F32"), ("c", vals * 2, "F32")], alignment=64)
    g = gk.io.GGUF(p)
    assert g.version == 3 and g.alignment == 64
    for t in g.tensors.values():
        assert t.offset % 64 == 0
    assert g._g.data_start % 64 == 0
    assert gk.to_numpy(g.dequantize("c")).tolist() == (vals * 2).tolist()
    # Version 2 has the same little-endian layout.
    raw = bytearray(p.read_bytes())
    raw[4:8] = (2).to_bytes(4, "little")
    p2 = tmp_path / "v2.gguf"
    p2.write_bytes(raw)
    g2 = gk.io.GGUF(p2)
    assert g2.version == 2
    assert gk.to_numpy(g2.dequantize("b")).tolist() == [[0, 1, 2]]


@needs_gguf
def test_errors_and_unsupported(tmp_path):
    p = tmp_path / "i.gguf"
    write_gguf(p, [("i", np.arange(6, dtype=np.int32), "I32")])
    g = gk.io.GGUF(p)
    assert g.tensors["i"].type == "I32"
    assert gk.to_numpy(g.raw("i")).view(np.int32).tolist() == list(range(6))
    with pytest.raises(ValueError, match="not supported"):
        g.dequantize("i")
    with pytest.raises(KeyError):
        g.dequantize("nope")
    write_gguf(p, [("f", np.ones(32, np.float32), "F32")])
    with pytest.raises(TypeError):
        gk.io.GGUF(p).dequantize("f", dtype="nonsense")
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        gk.io.GGUF(p).dequantize("f", dtype="float16")
    with pytest.raises(FileNotFoundError):
        gk.io.GGUF(tmp_path / "missing.gguf")


# ---- the default model -------------------------------------------------------

def default_model():
    try:
        return gk.io.default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_default_model_metadata():
    g = gk.io.GGUF(default_model())
    m = g.metadata
    assert m["general.architecture"] == "llama"
    assert g.version in (2, 3)
    assert m["llama.block_count"] == 30
    assert m["llama.embedding_length"] == 576
    assert m["llama.attention.head_count"] == 9
    toks = m["tokenizer.ggml.tokens"]
    assert len(toks) == 49152 and m["tokenizer.ggml.model"] == "gpt2"
    assert len(m["tokenizer.ggml.merges"]) > 40000
    assert "tokenizer.chat_template" in m
    assert len(g.tensors) == 272
    assert g.tensors["token_embd.weight"].shape == (49152, 576)
    assert isinstance(m["tokenizer.ggml.eos_token_id"], int)


@needs_gguf
def test_default_model_dequantize_matches_reference():
    path = default_model()
    g = gk.io.GGUF(path)
    r = gguf.GGUFReader(path)
    ref_tensors = {t.name: t for t in r.tensors}
    seen = set()
    for t in g.tensors.values():
        if t.type in seen or t.numel > 40_000_000:
            continue
        seen.add(t.type)
        rt = ref_tensors[t.name]
        raw = gk.to_numpy(g.raw(t.name))
        assert raw.tobytes() == np.ascontiguousarray(rt.data).view(np.uint8).tobytes()
        ref = gguf.quants.dequantize(rt.data, rt.tensor_type).reshape(t.shape)
        ours = gk.to_numpy(g.dequantize(t.name))
        assert np.array_equal(bits32(ours), bits32(ref)), t.name
    assert {"Q8_0", "Q4_1", "F32"} <= seen
