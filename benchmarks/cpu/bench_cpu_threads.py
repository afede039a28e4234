"""Decode time on the CPU against torch's thread counts: the demo model generates 32 tokens
(greedy, after a warm-up) in a fresh process for each (intra-op, inter-op) pair, alone and
beside one busy process (a shared box), and with the engine's own choice (OMP_NUM_THREADS
unset). Prints one JSON line.

    python -m benchmarks.cpu.bench_cpu_threads
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from minivllm.cpu_threads import engine_threads, usable_cores

_CHILD = r"""
import sys, time, torch
if sys.argv[1] != "auto":
    torch.set_num_threads(int(sys.argv[1])); torch.set_num_interop_threads(int(sys.argv[2]))
from minivllm import LLM, SamplingParams
llm = LLM()
llm.generate(["warm"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
start = time.perf_counter()
llm.generate(["Hello, my name is"], SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)
print(time.perf_counter() - start, torch.get_num_threads(), torch.get_num_interop_threads())
llm.shutdown()
"""


def run(intra: str, inter: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if intra != "auto":  # a user's choice: the engine leaves it
        env["OMP_NUM_THREADS"] = intra
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, intra, inter],
        env=env, capture_output=True, text=True, check=True, timeout=600,
    ).stdout.split()  # fmt: skip
    return {"seconds": round(float(out[0]), 2), "intra": int(out[1]), "inter": int(out[2])}


def main() -> None:
    cores = usable_cores()
    pairs = [(str(cores), str(cores)), ("1", "1"), ("auto", "auto")]
    results: dict = {"usable_cores": cores, "engine_threads": engine_threads(cores)}
    for label, busy in (("alone", False), ("beside_one_busy_process", True)):
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            results[label] = [run(intra, inter) for intra, inter in pairs]
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    print(json.dumps({"bench": "cpu_threads", **results}))


if __name__ == "__main__":
    main()
