"""Host cost of the scheduler per step at large batch (no model, no GPU): schedule() and
update() of `Scheduler` + `BlockManager` driven by a fake runner, with the `short` workload's
shape by default (1,024 sequences in flight, prompts of 16-128 ids). The engine's step is
max(host, device) under async scheduling, so at large batch this is the part that can bound it.

python -m benchmarks.cpu.bench_scheduler_cpu [--num-seqs 1024] [--steps 200] [--prefix-caching]
    [--async-scheduling] [--engine-heap] [--gc-freeze] [--profile]

Prints one JSON line: microseconds per step for schedule and update in the steady decode
state, and per sequence. --async-scheduling drives an AsyncScheduler as the engine does by
default: each step is scheduled while the one before it is in flight (pending tokens).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import random
import time

from minivllm.engine.sched.async_scheduler import AsyncScheduler
from minivllm.engine.sched.kv.block_manager import BlockManager
from minivllm.engine.sched.request import Request
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.engine.types import RunnerOutput
from minivllm.sampling_params import SamplingParams


class FinishedStep:
    """A launched step whose result is already there (AsyncScheduler keeps it in flight)."""

    def __init__(self, runner_out: RunnerOutput) -> None:
        self.runner_out = runner_out

    def result(self) -> RunnerOutput:
        return self.runner_out


def build(num_seqs: int, prefix_caching: bool, async_scheduling: bool) -> Scheduler:
    block_size = 16
    manager = BlockManager(num_seqs * 64, block_size, prefix_caching)
    scheduler_class = AsyncScheduler if async_scheduling else Scheduler
    scheduler = scheduler_class(num_seqs, 16384, 4096, manager)
    rng = random.Random(0)
    for i in range(num_seqs):
        prompt = [rng.randrange(3, 150000) for _ in range(rng.randint(16, 128))]
        params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=100_000)
        scheduler.add_request(Request(f"r{i}", prompt, params, arrival_time=0.0))
    return scheduler


def run_steps(scheduler: Scheduler, steps: int) -> tuple[float, float]:
    """Seconds spent in schedule() and in update() over `steps` steps."""
    t_sched = t_update = 0.0
    for n in range(steps):
        t0 = time.perf_counter()
        sched_out = scheduler.schedule()
        t1 = time.perf_counter()
        req_ids = [c.req_id for c in sched_out.chunks if c.sample]
        runner_out = RunnerOutput(req_ids, [(n + i) % 1000 + 3 for i in range(len(req_ids))])
        if isinstance(scheduler, AsyncScheduler):
            runner_out = FinishedStep(runner_out)
        t2 = time.perf_counter()
        scheduler.update(sched_out, runner_out)
        t3 = time.perf_counter()
        t_sched += t1 - t0
        t_update += t3 - t2
    return t_sched, t_update


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-seqs", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--prefix-caching", action="store_true")
    parser.add_argument("--async-scheduling", action="store_true")
    parser.add_argument(
        "--engine-heap",
        action="store_true",
        help="import torch and the engine first: the collector's full passes then walk the "
        "~200k objects an engine process holds, not this script's ~20k",
    )
    parser.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() after the prefills (as vLLM does)"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile top functions, stderr")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.engine_heap:
        import minivllm.entrypoints.llm  # noqa: F401  (and with it torch and transformers)
    scheduler = build(args.num_seqs, args.prefix_caching, args.async_scheduling)
    while scheduler.waiting or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in scheduler.running
    ):
        run_steps(scheduler, 1)  # the prefills
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    gc_before = [g["collections"] for g in gc.get_stats()]
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    t_sched, t_update = run_steps(scheduler, args.steps)
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    gc_counts = [g["collections"] - n for g, n in zip(gc.get_stats(), gc_before)]
    us = 1e6 / args.steps
    result = {
        "bench": "scheduler_cpu",
        **{k: v for k, v in vars(args).items() if k != "profile"},
        "schedule_us_per_step": round(t_sched * us, 1),
        "update_us_per_step": round(t_update * us, 1),
        "us_per_seq": round((t_sched + t_update) * us / args.num_seqs, 2),
        "gc_collections_by_generation": gc_counts,
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
