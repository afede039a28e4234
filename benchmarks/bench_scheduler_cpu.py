"""Host cost of the scheduler per step at large batch (no model, no GPU): schedule() and
update() of `Scheduler` + `BlockManager` driven by a fake runner, with the `short` workload's
shape by default (1,024 sequences in flight, prompts of 16-128 ids). The engine's step is
max(host, device) under async scheduling, so at large batch this is the part that can bound it.

python benchmarks/bench_scheduler_cpu.py [--num-seqs 1024] [--steps 200] [--profile]

Prints one JSON line: microseconds per step for schedule and update in the steady decode
state, and per sequence.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import time

from minivllm.engine.block_manager import BlockManager
from minivllm.engine.request import Request
from minivllm.engine.scheduler import Scheduler
from minivllm.engine.types import RunnerOutput
from minivllm.sampling_params import SamplingParams


def build(num_seqs: int, prefix_caching: bool) -> Scheduler:
    block_size = 16
    manager = BlockManager(num_seqs * 64, block_size, prefix_caching)
    scheduler = Scheduler(num_seqs, 16384, 4096, manager)
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
        t2 = time.perf_counter()
        scheduler.update(sched_out, runner_out)
        t3 = time.perf_counter()
        t_sched += t1 - t0
        t_update += t3 - t2
    return t_sched, t_update


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-seqs", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--prefix-caching", action="store_true")
    parser.add_argument("--profile", action="store_true", help="cProfile top functions, stderr")
    args = parser.parse_args()
    scheduler = build(args.num_seqs, args.prefix_caching)
    while scheduler.waiting or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in scheduler.running
    ):
        run_steps(scheduler, 1)  # the prefills
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    t_sched, t_update = run_steps(scheduler, args.steps)
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    us = 1e6 / args.steps
    result = {
        "bench": "scheduler_cpu",
        "num_seqs": args.num_seqs,
        "steps": args.steps,
        "schedule_us_per_step": round(t_sched * us, 1),
        "update_us_per_step": round(t_update * us, 1),
        "us_per_seq": round((t_sched + t_update) * us / args.num_seqs, 2),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
