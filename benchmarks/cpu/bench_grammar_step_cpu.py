"""Host cost per step of structured outputs at large batch (no model, no GPU): a `Scheduler`
driven by a fake runner with N requests in flight, every one under bench_structured.py's JSON
schema with SmolLM2's tokenizer (the demo GGUF's), against the same run unconstrained.

python -m benchmarks.cpu.bench_grammar_step_cpu [--num-seqs 256] [--steps 100] [--profile]
    [--greedy]

Per step, constrained: schedule() (it builds the step's constrained rows), the mask fill (the
scheduler's grammar_output(), overlapped with the forward in the engine) and update() (it
advances every matcher by its sampled token); each fake token is drawn at random among those
the row's mask allows (--greedy: the allowed token of highest score in one fixed random
score vector, as greedy decoding of a model whose logits do not depend on the context would
pick). A request that ends is replaced, so N stay in flight. Prints one JSON
line: microseconds per step (medians), and the grammar's extra host time (constrained minus
unconstrained schedule() + update(), and the fill).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import statistics
import time

import numpy as np
import torch

from benchmarks.engine.bench_structured import SCHEMA
from minivllm.demo_model import demo_gguf_file
from minivllm.engine.sched.kv.block_manager import BlockManager
from minivllm.engine.sched.request import Request
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.engine.types import RunnerOutput
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output import StructuredOutputsParams
from minivllm.structured_output.manager import StructuredOutputManager
from minivllm.tokenizer import load_tokenizer


class Driver:
    """One scheduler with num_seqs requests in flight, constrained or not."""

    def __init__(
        self, num_seqs: int, constrained: bool, vocab_size: int, tokenizer: str, greedy: bool
    ) -> None:
        manager = None
        if constrained:
            manager = StructuredOutputManager(
                tokenizer, vocab_size, num_seqs, wait_for_compiles=True
            )
        block_manager = BlockManager(num_seqs * 64, 16, False)
        self.scheduler = Scheduler(num_seqs, 16384, 4096, block_manager, manager)
        self.constrained = constrained
        self.vocab_size = vocab_size
        self.rng = random.Random(0)
        self.np_rng = np.random.default_rng(0)
        self.greedy = greedy
        self.fixed_scores = self.np_rng.random(vocab_size, dtype=np.float32)
        self.num_added = 0
        for _ in range(num_seqs):
            self.add_request()

    def add_request(self) -> None:
        prompt = [self.rng.randrange(3, self.vocab_size) for _ in range(16)]
        so = StructuredOutputsParams(json=SCHEMA) if self.constrained else None
        params = SamplingParams(
            temperature=0.6, ignore_eos=True, max_tokens=100_000, structured_outputs=so
        )
        self.scheduler.add_request(Request(f"r{self.num_added}", prompt, params, 0.0))
        self.num_added += 1

    def draw(self, bitmask: np.ndarray) -> np.ndarray:
        """One token per bitmask row among those the row allows: uniform, or greedy."""
        bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")
        bits = bits[:, : self.vocab_size]
        if self.greedy:
            return (self.fixed_scores * bits).argmax(axis=1)
        return (self.np_rng.random(bits.shape, dtype=np.float32) * bits).argmax(axis=1)

    def step(self) -> tuple[float, float, float]:
        """Seconds in schedule(), the mask fill and update() for one step."""
        t0 = time.perf_counter()
        sched_out = self.scheduler.schedule()
        t1 = time.perf_counter()
        req_ids = [c.req_id for c in sched_out.chunks if c.sample]
        token_ids = [self.rng.randrange(3, self.vocab_size) for _ in req_ids]
        t_fill = 0.0
        t2 = time.perf_counter()
        grammar = self.scheduler.grammar_output(sched_out)
        if grammar is not None:
            t_fill = time.perf_counter() - t2
            for row, token_id in zip(grammar.rows, self.draw(grammar.bitmask).tolist()):
                token_ids[row] = token_id
        t3 = time.perf_counter()
        outputs = self.scheduler.update(sched_out, RunnerOutput(req_ids, token_ids))
        t4 = time.perf_counter()
        for output in outputs:
            if output.finish_reason == "error":
                raise RuntimeError(f"{output.req_id} failed: {output.error}")
            if output.finish_reason is not None:
                self.add_request()
        return t1 - t0, t_fill, t4 - t3


def measure(driver: Driver, steps: int, profile: bool) -> dict[str, float]:
    for _ in range(10):  # the prefills, then a few decodes
        driver.step()
    profiler = cProfile.Profile() if profile and driver.constrained else None
    if profiler:
        profiler.enable()
    times = [driver.step() for _ in range(steps)]
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    # Medians: on a small shared host a mean is dominated by the odd descheduled step.
    schedule, fill, update = (round(statistics.median(t) * 1e6, 1) for t in zip(*times))
    return {"schedule_us": schedule, "fill_us": fill, "update_us": update}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--profile", action="store_true", help="cProfile top functions, stderr")
    parser.add_argument("--greedy", action="store_true", help="greedy tokens (see above)")
    args = parser.parse_args()
    tokenizer = demo_gguf_file()
    vocab_size = len(load_tokenizer(tokenizer))
    constrained = measure(
        Driver(args.num_seqs, True, vocab_size, tokenizer, args.greedy), args.steps, args.profile
    )
    free = measure(
        Driver(args.num_seqs, False, vocab_size, tokenizer, args.greedy), args.steps, False
    )
    extra = {
        "schedule": constrained["schedule_us"] - free["schedule_us"],
        "update": constrained["update_us"] - free["update_us"],
    }
    result = {
        "bench": "grammar_step_cpu",
        "num_seqs": args.num_seqs,
        "steps": args.steps,
        "greedy": args.greedy,
        "torch_threads": torch.get_num_threads(),
        "constrained": constrained,
        "unconstrained": free,
        "extra_us_per_step": {k: round(v, 1) for k, v in extra.items()}
        | {"fill": constrained["fill_us"]},
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
