"""Kernel warm-up at engine start (CUDA): a few throwaway requests through a throwaway
scheduler, so that the kernels a first real request needs are compiled before it comes.

CUDA graphs compile what they capture, but attention runs eagerly in mixed steps, and its
tile configurations (small and large prefills, split-KV decodes next to a prefill) and the
random-sampling kernels compile on first use: on a fresh H200 the first requests to a new
server waited up to ~2 s (TTFT p99 2,133 ms at 10 req/s, against 45 ms once warm).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from minivllm.engine.request import Request
from minivllm.engine.scheduler import Scheduler
from minivllm.engine.types import RunnerOutput, SchedulerOutput
from minivllm.sampling_params import SamplingParams


def warm_up(
    scheduler: Scheduler,
    execute: Callable[[SchedulerOutput], object],
    execute_sync: Callable[[SchedulerOutput], RunnerOutput],
    vocab_size: int,
    max_model_len: int,
    kv_capacity: int,
) -> int:
    """Runs the warm-up requests to the end on `scheduler` (then dropped) through the
    engine's own execute; returns the number of steps. Every request is seeded, so that the
    engine's step generator (unseeded sampling) is where it was: outputs do not change.
    kv_capacity: tokens the KV cache holds; each request takes at most a quarter of it."""
    rng = random.Random(0)
    longest = max(1, min(1000, max_model_len - 8, kv_capacity // 4 - 3))

    def add(index: int, num_tokens: int, **params) -> None:
        prompt = [rng.randrange(vocab_size) for _ in range(min(num_tokens, longest))]
        params = SamplingParams(max_tokens=3, ignore_eos=True, **params)
        scheduler.add_request(Request(f"warm-up-{index}", prompt, params, time.time()))

    add(0, 1000, temperature=0.0, seed=0)  # a large prefill
    add(1, 24, temperature=0.8, top_p=0.9, top_k=20, seed=1)  # a small one, sampled
    steps = 0
    while scheduler.has_unfinished_requests():
        sched_out = scheduler.schedule()
        scheduler.update(sched_out, execute(sched_out))
        steps += 1
        if steps == 1:  # a prefill beside the first two's decodes (split-KV next to prefill)
            add(2, 300, temperature=0.0, seed=2)
        if steps == 10_000:  # cannot happen (each request fits); never hang an engine start
            scheduler.abort_requests([f"warm-up-{i}" for i in range(3)])
    # An empty step hands the finished ids to the runner, which forgets their state.
    execute_sync(scheduler.schedule())
    return steps
