"""Kernel warm-up at engine start (CUDA): a few throwaway requests through a throwaway
scheduler, so that the kernels a first real request needs are compiled before it comes.

CUDA graphs compile what they capture, but attention runs eagerly in mixed steps, and its
tile configurations (small and large prefills, split-KV decodes next to a prefill), its
prefill kernels (on Hopper the Gluon one for large steps, with either program order, the
Triton one below them: attention/triton.py), steps
larger than the piecewise graphs (every kernel, at token counts the graphs never see) and the
sampling kernels (the plain pass on the model's logits, the float32 draw after filters)
compile on first use: without the warm-up the first requests to a fresh server wait seconds
for those compiles, where a warm one answers in tens of ms. The engine logs every Triton
compile after the warm-up (kernels/late_compiles.py): each is a variant missing here.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from minivllm.attention.triton import GLUON_MIN_STEP_TOKENS
from minivllm.engine.sched.request import Request
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.sampling_params import SamplingParams


def warm_up(
    scheduler: Scheduler,
    run_step: Callable[[Scheduler], object],
    vocab_size: int,
    max_model_len: int,
    kv_capacity: int,
) -> int:
    """Runs the warm-up requests to the end on `scheduler` (then dropped) through the
    engine's own step (run_step: EngineCore.run_step); returns the number of steps. Every
    request is seeded, so that the engine's step generator (unseeded sampling) is where it
    was: outputs do not change.
    kv_capacity: tokens the KV cache holds; the first step's prompts take at most half of it,
    each request at most a quarter."""
    rng = random.Random(0)
    longest = max(1, min(1000, max_model_len - 8, kv_capacity // 4 - 3))
    added: list[str] = []

    def add(num_tokens: int, **params) -> None:
        prompt = [rng.randrange(vocab_size) for _ in range(min(num_tokens, longest))]
        params = SamplingParams(max_tokens=3, ignore_eos=True, seed=len(added), **params)
        added.append(f"warm-up-{len(added)}")
        scheduler.add_request(Request(added[-1], prompt, params, time.time()))

    # Step 0: as many prompt tokens as a step takes (the large-prefill tiles; past the
    # piecewise graphs' sizes, an eager step, at a count off their multiples of 16), all
    # greedy: the fused sampler's plain pass on the model's logits.
    first = max(1, min(scheduler.max_num_batched_tokens, kv_capacity // 2))
    if first % 16 == 0 and first > 1:
        first -= 1  # a count off the graphs' multiples of 16
    while first > 0:
        add(first, temperature=0.0)
        first -= longest
    # Prompts of `longest` tokens making a step of at least GLUON_MIN_STEP_TOKENS (0 where a
    # step or half the KV cache cannot hold them).
    large_step = GLUON_MIN_STEP_TOKENS // longest + 1
    if large_step * longest > min(scheduler.max_num_batched_tokens, kv_capacity // 2):
        large_step = 0
    steps = 0
    while scheduler.has_unfinished_requests():
        run_step(scheduler)
        steps += 1
        if steps == 1:  # a small prefill, filtered: the sampler's float32 draw
            add(24, temperature=0.8, top_p=0.9, top_k=20)
        if steps == 2:  # a prefill beside decodes (split-KV next to a prefill)
            add(300, temperature=0.0)
        if steps == 3:  # a mid-size prefill: the Triton kernel's large tiles, below "large"
            for _ in range(2):
                add(longest, temperature=0.0)
        if steps == 5 and large_step:  # large by its tokens alone, from a few prompts: the
            for _ in range(large_step):  # Gluon kernel with fewer programs than a wave
                add(longest, temperature=0.0)
        if steps == 10_000:  # cannot happen (each request fits); never hang an engine start
            scheduler.abort_requests(added)
    # An empty step hands the finished ids to the runner, which forgets their state.
    run_step(scheduler)
    return steps
