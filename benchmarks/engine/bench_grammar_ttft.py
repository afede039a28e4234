"""Batch-1 TTFT with a cached grammar against the same engine unconstrained, alternating in one
process, with the host time of each step phase. One JSON line per round and mode.

    python -m benchmarks.engine.bench_grammar_ttft DIR   # DIR: bench_structured.py make DIR
    python -m benchmarks.engine.bench_grammar_ttft DIR --plain   # never constrained: no llguidance

Each measurement: the median of 10 one-token generates of new 1,000-token prompts (after one
more). The phases are host wall times per generate (wrapped calls: they include the waits).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time

import torch

from benchmarks.engine.bench_structured import SCHEMA
from benchmarks.engine.step_phases import timed
from minivllm import LLM, SamplingParams
from minivllm.engine.engine_core import EngineCore
from minivllm.engine.runner import model_runner
from minivllm.engine.runner.model_runner import ModelRunner
from minivllm.engine.sched.async_scheduler import AsyncScheduler
from minivllm.structured_output.manager import StructuredOutputManager
from minivllm.structured_output.params import StructuredOutputsParams

PHASES = [
    (EngineCore, "step"),
    (AsyncScheduler, "schedule"),
    (AsyncScheduler, "update"),
    (ModelRunner, "forward"),
    (ModelRunner, "run_model"),
    (ModelRunner, "sample"),
    (StructuredOutputManager, "fill"),
    (model_runner, "apply_bitmask"),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("--plain", action="store_true", help="unconstrained only")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    seconds: dict[str, float] = collections.defaultdict(float)
    for owner, name in PHASES:
        timed(seconds, owner, name)
    llm = LLM(args.model_dir, load_format="dummy", max_model_len=4096)

    def params(constrained: bool) -> SamplingParams:
        so = StructuredOutputsParams(json=SCHEMA) if constrained else None
        return SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=1, structured_outputs=so)

    llm.generate([{"prompt_token_ids": [5, 6, 7]}], params(not args.plain), use_tqdm=False)
    modes = (False,) if args.plain else (False, True)
    for round_ in range(args.rounds):
        for constrained in modes:
            seconds.clear()
            times = []
            for i in range(11):
                ids = [(7 * i + j + 13 * round_) % 10000 for j in range(1000)]
                torch.cuda.synchronize()
                start = time.perf_counter()
                llm.generate([{"prompt_token_ids": ids}], params(constrained), use_tqdm=False)
                times.append(time.perf_counter() - start)
            result = {
                "bench": "grammar_ttft",
                "constrained": constrained,
                "llguidance_loaded": not args.plain,
                "ttft_ms": round(statistics.median(times[1:]) * 1e3, 3),
                "host_ms_per_generate": {k: round(v / 11 * 1e3, 3) for k, v in seconds.items()},
            }
            print(json.dumps(result), flush=True)
    llm.shutdown()


if __name__ == "__main__":
    main()
