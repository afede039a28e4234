"""Host cost of a step's sampling metadata at large batch (no model, no GPU): SamplingState.
build_metadata over a batch that changes by a few requests every step, as a busy engine's
does, with the `chat` workload's sampling options (benchmarks/workloads.py) or temperature
alone. The engine's step is max(host, device) under async scheduling, so at large batch this
is the part that can bound it.

python -m benchmarks.cpu.bench_sampling_host_cpu [--num-seqs 512] [--steps 200] [--churn 2]

Prints one JSON line: milliseconds per build (median) for each sampling mix, and per read of a
step's logprobs on the host (StepHandle's), in the thread's CPU time (what they cost, whatever
else runs on the box).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from benchmarks.workloads import CHAT_BASE, chat_sampling
from minivllm.engine.runner.sampling.logprob_packing import to_runner_logprobs
from minivllm.engine.runner.sampling.sampling_state import SamplingState
from minivllm.engine.types import NewRequestData
from minivllm.sampling_params import SamplingParams

VOCAB = 151936


def build_times(
    options: list[dict], num_seqs: int, steps: int, churn: int
) -> tuple[list[float], list[float]]:
    """Seconds of each build_metadata, churn requests replaced before each, and each row's
    sampled token counted as the runner counts it (record, then the host append); and of
    each step's logprobs read on the host (the packed rows of the rows that asked, to
    per-row dicts, as StepHandle reads them; zeros where no row asked)."""
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
    times, reads = [], []
    for _ in range(steps):
        for _ in range(churn):
            state.remove(live.pop(rng.randrange(len(live))))
            add()
        start = time.thread_time()
        meta = state.build_metadata(live)
        times.append(time.thread_time() - start)
        reads.append(logprobs_read_time(state, live, meta))
        sampled = [rng.randrange(VOCAB) for _ in live]
        if meta.penalty_rows is not None:
            state.record_sampled(meta, torch.tensor(sampled))
        state.append_tokens(live, sampled)
    return times, reads


def logprobs_read_time(state: SamplingState, live: list[str], meta) -> float:
    """Seconds to read a step's logprobs on the host: its packed rows (one for each row that
    asked) to per-row dicts (StepHandle's read); 0 where no row asked."""
    if meta.max_num_logprobs is None:
        return 0.0
    rows = len(live) if meta.logprob_rows is None else len(meta.logprob_rows)
    packed = torch.zeros(rows, 2 * (meta.max_num_logprobs + 1) + 1, dtype=torch.float64)
    num_logprobs = state.num_logprobs(live)
    start = time.thread_time()
    to_runner_logprobs(packed.tolist(), num_logprobs)
    return time.thread_time() - start


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
        times, reads = build_times(options, args.num_seqs, args.steps, args.churn)
        result[f"{name}_ms"] = round(statistics.median(times) * 1e3, 3)
        result[f"{name}_logprobs_read_ms"] = round(statistics.median(reads) * 1e3, 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
