"""Host cost of n-gram drafting per step (no model, no GPU): `Drafter.propose` as the runner
calls it once a step's tokens are read, for requests whose histories grow by a few tokens a
step, the way a drafting step runs at batch 1 (the next step waits for it). A history is text that
repeats itself, as the prompts speculation is for do: --prompt-len tokens of 16-token phrases
drawn from a pool of 32 (ids below 32,000), and each step appends 4 tokens of another phrase.

python -m benchmarks.cpu.bench_ngram_cpu [--batch 1] [--prompt-len 2000] [--steps 200]

Prints one JSON line: microseconds per propose call in the steady state, and of the first
call (a proposer that indexes histories pays that once per request).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time

from minivllm.engine.runner.drafts.drafter import Drafter
from minivllm.engine.types import NewRequestData, SchedulerOutput
from minivllm.sampling_params import SamplingParams
from minivllm.spec_decode.config import SpeculativeConfig
from minivllm.spec_decode.ngram import NgramProposer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    config = SpeculativeConfig.from_dict(
        {
            "method": "ngram",
            "num_speculative_tokens": 4,
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 2,
        }
    )
    drafter = Drafter(NgramProposer.from_config(config))
    rng = random.Random(0)
    params = SamplingParams(max_tokens=1 << 19, ignore_eos=True)
    phrases = [[rng.randrange(32000) for _ in range(16)] for _ in range(32)]

    def text(num_tokens: int) -> list[int]:
        ids: list[int] = []
        while len(ids) < num_tokens:
            ids += rng.choice(phrases)
        return ids[:num_tokens]

    new = [NewRequestData(str(i), text(args.prompt_len), params) for i in range(args.batch)]
    drafter.update(SchedulerOutput([], 0, new))
    # Every request asks for k drafts after every step, as one that drafts and keeps them does.
    asked = [(r.req_id, config.num_speculative_tokens) for r in new]
    for r in new:
        drafter.append(r.req_id, [rng.randrange(32000)])  # its first output token
    gc.collect()
    gc.freeze()  # as the engine does once it is built: collections skip what exists now
    start = time.perf_counter()
    drafter.propose(asked)
    first_us = (time.perf_counter() - start) * 1e6
    elapsed, drafted = 0.0, 0
    for _ in range(args.steps):
        for r in new:
            drafter.append(r.req_id, text(4))
        start = time.perf_counter()
        drafted += sum(1 for d in drafter.propose(asked).values() if d)
        elapsed += time.perf_counter() - start
    print(
        json.dumps(
            {
                "bench": "ngram_cpu",
                "batch": args.batch,
                "prompt_len": args.prompt_len,
                "steps": args.steps,
                "first_call_us": round(first_us, 1),
                "us_per_call": round(elapsed / args.steps * 1e6, 1),
                "rows_drafted_per_call": round(drafted / args.steps, 2),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
