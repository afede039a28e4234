"""Creates and destroys an LLM 20 times in one process; prints one JSON line with what leaked.

Each round builds the engine (CUDA graphs and KV cache on a GPU), generates, shuts down and
drops every reference. Reported: GPU memory allocated and in use (driver view) before and after,
resident memory, OS and Python threads, child processes.

    python benchmarks/create_destroy_check.py                 # Qwen3-0.6B shape, dummy weights
    python benchmarks/create_destroy_check.py --rounds 5 --tensor-parallel-size 2
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import threading

import torch

from minivllm import LLM, SamplingParams
from minivllm.tiny_model import default_tiny_model_dir, make_dummy_model_dir


def snapshot() -> dict:
    """Memory, threads and children of this process, now."""
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    children = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            children += f.read().split()
    state = dict(
        rss_mb=round(int(status["VmRSS"].split()[0]) / 1024),
        os_threads=int(status["Threads"]),
        py_threads=threading.active_count(),
        children=len(children),
    )
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        state["gpu_allocated_mib"] = round(torch.cuda.memory_allocated() / 2**20, 1)
        state["gpu_in_use_mib"] = round((total - free) / 2**20)
    return state


def use_once(model_dir: str, args: argparse.Namespace) -> int:
    llm = LLM(
        model_dir,
        load_format="dummy" if torch.cuda.is_available() else "auto",
        max_model_len=2048 if torch.cuda.is_available() else 512,
        gpu_memory_utilization=0.5,
        tensor_parallel_size=args.tensor_parallel_size,
    )
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=2)
    prompts = [{"prompt_token_ids": [(7 * i + j) % 1000 + 5 for j in range(300)]} for i in range(8)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    llm.shutdown()
    del llm
    return sum(len(o.outputs[0].token_ids) for o in outs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    args = parser.parse_args()
    if torch.cuda.is_available():
        model_dir = make_dummy_model_dir("qwen3-0.6b", tempfile.mkdtemp(prefix="q06-"))
    else:
        model_dir = default_tiny_model_dir()
    use_once(model_dir, args)  # the first round loads libraries and compiles kernels
    gc.collect()
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    before, tokens = snapshot(), 0
    for _ in range(args.rounds):
        tokens += use_once(model_dir, args)
        gc.collect()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    print(json.dumps(dict(rounds=args.rounds, tokens=tokens, before=before, after=snapshot())))


main()
