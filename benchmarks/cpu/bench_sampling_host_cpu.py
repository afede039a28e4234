"""Host cost of a step's sampling metadata at large batch (no model, no GPU): SamplingState.
build_metadata over a batch that changes by a few requests every step, as a busy engine's
does, with the `chat` workload's sampling options (benchmarks/workloads.py) or temperature
alone. The engine's step is max(host, device) under async scheduling, so at large batch this
is the part that can bound it.

python -m benchmarks.cpu.bench_sampling_host_cpu [--num-seqs 512] [--steps 200] [--churn 2]

Prints one JSON line: milliseconds per build (median) for each sampling mix, in the building
thread's CPU time (what the build costs, whatever else runs on the box).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from benchmarks.workloads import CHAT_BASE, chat_sampling
from minivllm.engine.runner.sampling_state import SamplingState
from minivllm.engine.types import NewRequestData
from minivllm.sampling_params import SamplingParams

VOCAB = 151936


def build_times(options: list[dict], num_seqs: int, steps: int, churn: int) -> list[float]:
    """Seconds of each build_metadata, churn requests replaced before each, and each row's
    sampled token counted as the runner counts it (record, then the host append)."""
    rng = random.Random(0)
    state = SamplingState("cpu", max_num_seqs=num_seqs, vocab_size=VOCAB)
    state.keyed_draws = True  # as on CUDA: every random batch gets draw keys
    prompts = [[rng.randrange(VOCAB) for _ in range(400)] for _ in range(64)]
    live: list[str] = []
    added = 0

    def add() -> None:
        nonlocal added
        params = SamplingParams(max_tokens=1000, **options[added % len(options)])
        state.add_request(NewRequestData(f"r{added}", prompts[added % 64], params))
        live.append(f"r{added}")
        added += 1

    for _ in range(num_seqs):
        add()
    times = []
    for _ in range(steps):
        for _ in range(churn):
            state.remove(live.pop(rng.randrange(len(live))))
            add()
        start = time.thread_time()
        meta = state.build_metadata(live)
        times.append(time.thread_time() - start)
        sampled = [rng.randrange(VOCAB) for _ in live]
        if meta.penalty_rows is not None:
            state.record_sampled(meta, torch.tensor(sampled))
        state.append_tokens(live, sampled)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-seqs", type=int, default=512)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--churn", type=int, default=2, help="requests replaced per step")
    args = parser.parse_args()
    mixes = {
        "chat": chat_sampling(random.Random(0), 1000),
        "chat_base": [dict(CHAT_BASE)],
        "temperature": [{"temperature": CHAT_BASE["temperature"]}],
    }
    result = {"num_seqs": args.num_seqs, "churn": args.churn}
    for name, options in mixes.items():
        times = build_times(options, args.num_seqs, args.steps, args.churn)
        result[f"{name}_ms"] = round(statistics.median(times) * 1e3, 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
