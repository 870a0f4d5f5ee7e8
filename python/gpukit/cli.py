"""The `gpukit` command: generate, chat, info, bench (default model: SmolLM2-135M-Instruct).

    gpukit generate "The capital of France is"
    gpukit chat                      # interactive; one user message per line, streamed answers
    gpukit info --model path/to/model.gguf
    gpukit bench --prompt-tokens 128 --new-tokens 64
"""
from __future__ import annotations

import argparse
import sys
import time


def _load(args):
    from . import llm
    return llm.load(args.model, device=args.device, dtype=args.dtype, progress=sys.stderr.isatty(),
                    quantize=args.quantize or None, cuda_graph=not args.no_cuda_graph)


def _sampling(args):
    return dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                top_p=args.top_p, seed=args.seed)


def cmd_generate(args):
    model = _load(args)
    prompt = " ".join(args.prompt)
    if args.chat:
        pieces = model.chat([{"role": "user", "content": prompt}], stream=True, **_sampling(args))
    else:
        print(prompt, end="", flush=True)
        pieces = model.stream(prompt, stop=args.stop or None, **_sampling(args))
    for p in pieces:
        print(p, end="", flush=True)
    print()
    return 0


def cmd_chat(args):
    model = _load(args)
    session = model.session(max_tokens=args.max_context, system=args.system)
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        line = line.strip()
        if not line:
            continue
        if line in ("/exit", "/quit"):
            break
        if line == "/reset":
            session.reset()
            continue
        for p in session.chat(line, stream=True, **_sampling(args)):
            print(p, end="", flush=True)
        print()
    return 0


def cmd_info(args):
    model = _load(args)
    c = model.config
    print(f"model:          {args.model or '(default) ' + _default_path()}")
    print(f"architecture:   {c.architecture} (family {c.family}, {c.format})")
    for k in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
              "max_positions", "rope_theta", "rotary_dim", "rope_interleaved", "norm_eps", "tie_embeddings",
              "qk_norm", "attention_bias", "bos_id", "eos_ids"):
        print(f"{k + ':':<16}{getattr(c, k)}")
    print(f"weights:        {model._m.nbytes / 2**20:.1f} MiB as {args.dtype} on {model.device}")
    tok = model.tokenizer
    if tok is not None:
        print(f"tokenizer:      {tok.vocab_size} tokens, chat template: {'yes' if tok.chat_template else 'no'}")
    return 0


def _default_path():
    from . import io
    try:
        return str(io.default_model_path())
    except Exception as e:  # pragma: no cover
        return f"<{e}>"


def cmd_bench(args):
    from . import _C, synchronize
    model = _load(args)
    c = model.config
    prompt = [(i * 7919 + 13) % c.vocab_size for i in range(args.prompt_tokens)]
    for it in range(args.repeat + 1):
        g = _C.llm.Generation(model._m, [prompt] * args.batch, max_new_tokens=args.new_tokens, ignore_eos=True)
        t0 = time.perf_counter()
        g.step()
        if args.device != "cpu":
            synchronize()
        t1 = time.perf_counter()
        n = 1
        while not g.done:
            g.step()
            n += 1
        if args.device != "cpu":
            synchronize()
        t2 = time.perf_counter()
        if it == 0 and args.repeat > 0:
            continue  # warm-up
        pre = args.batch * args.prompt_tokens / (t1 - t0)
        dec = args.batch * (n - 1) / (t2 - t1) if n > 1 else float("nan")
        print(f"batch {args.batch}, prompt {args.prompt_tokens}, new {args.new_tokens}: "
              f"prefill {pre:.1f} tok/s (time to first token {1000 * (t1 - t0):.1f} ms), decode {dec:.1f} tok/s")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="gpukit", description="Run language models with gpukit.")
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp, sampling=True):
        sp.add_argument("--model", default=None, help="GGUF file or Hugging Face directory (default: SmolLM2-135M)")
        sp.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
        sp.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
        sp.add_argument("--quantize", default="", choices=["", "fp8", "int8", "int4"],
                        help="quantize the linear weights at load time")
        sp.add_argument("--no-cuda-graph", action="store_true", help="run each CUDA decode step eagerly")
        if sampling:
            sp.add_argument("--max-new-tokens", type=int, default=128)
            sp.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
            sp.add_argument("--top-k", type=int, default=0)
            sp.add_argument("--top-p", type=float, default=1.0)
            sp.add_argument("--seed", type=int, default=0)

    g = sub.add_parser("generate", help="continue a prompt (or answer it with --chat)")
    common(g)
    g.add_argument("prompt", nargs="+")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.set_defaults(fn=cmd_generate)
    c = sub.add_parser("chat", help="interactive chat: one message per line on stdin (/reset, /exit)")
    common(c)
    c.add_argument("--system", default=None, help="system prompt")
    c.add_argument("--max-context", type=int, default=2048, help="KV cache size in tokens (the conversation's limit)")
    c.set_defaults(fn=cmd_chat)
    i = sub.add_parser("info", help="print the model's configuration")
    common(i, sampling=False)
    i.set_defaults(fn=cmd_info)
    b = sub.add_parser("bench", help="prefill and decode tokens/s")
    common(b, sampling=False)
    b.add_argument("--prompt-tokens", type=int, default=128)
    b.add_argument("--new-tokens", type=int, default=64)
    b.add_argument("--batch", type=int, default=1)
    b.add_argument("--repeat", type=int, default=1)
    b.set_defaults(fn=cmd_bench)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, TypeError, IndexError) as e:
        print(f"gpukit {args.cmd}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
