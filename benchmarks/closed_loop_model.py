"""What a closed loop of clients costs against an offline queue, in a step model (no engine).

`vllm bench serve --max-concurrency 128` is a closed loop: a client sends its next request
only after the last chunk of its previous one arrived. Offline, the same 512 requests wait in
the engine's queue. This models the scheduler step by step (a token budget per step, decode
rows first, then prefill chunks first-come first-served, up to 128 running) with a step time
of base + per decode row + per prefill token, and a turnaround: the time from a request's last
token in the engine to its successor's arrival there (the server delivering the end of the
stream, the client reading it and sending the next request, the server handing it to the
core). Prints one JSON line: tok/s offline, and served / offline for each turnaround.

python benchmarks/closed_loop_model.py [--turnarounds-ms 0,5,20,50,100,200,300]

The default step costs are the H200's for Qwen3-0.6B at 128 sequences, roughly (a 6 ms decode
step at ~1,100 tokens of context; ~2.2 us a prefill token); the ratio is what matters, and it
moves little with them.
"""

from __future__ import annotations

import argparse
import json


def run(
    closed: bool,
    turnaround_ms: float,
    num_requests: int = 512,
    seats: int = 128,
    prompt_len: int = 1000,
    output_len: int = 200,
    budget: int = 8192,
    base_ms: float = 4.5,
    row_us: float = 10.0,
    prefill_us: float = 2.2,
) -> float:
    """Output tok/s of the modelled run."""
    first = seats if closed else num_requests
    waiting = [{"arrival": 0.0, "prefilled": 0, "generated": 0} for _ in range(first)]
    issued, running, pending, now, tokens = first, [], [], 0.0, 0
    while running or waiting or pending:
        waiting += [r for r in pending if r["arrival"] <= now]
        pending = [r for r in pending if r["arrival"] > now]
        while waiting and len(running) < seats:
            running.append(waiting.pop(0))
        if not running:  # every seat empty until the next arrival
            now = min(r["arrival"] for r in pending)
            continue
        decodes = [r for r in running if r["prefilled"] >= prompt_len]
        left, prefill, firsts = budget - len(decodes), 0, []
        for r in running:
            if r["prefilled"] < prompt_len and left > 0:
                chunk = min(prompt_len - r["prefilled"], left)
                r["prefilled"] += chunk
                left -= chunk
                prefill += chunk
                if r["prefilled"] >= prompt_len:
                    firsts.append(r)  # its first token comes with its last chunk
        now += base_ms + row_us * len(decodes) / 1000 + prefill_us * prefill / 1000
        for r in decodes + firsts:
            r["generated"] += 1
            tokens += 1
        for r in [r for r in running if r["generated"] >= output_len]:
            running.remove(r)
            if closed and issued < num_requests:
                pending.append({"arrival": now + turnaround_ms, "prefilled": 0, "generated": 0})
                issued += 1
    return tokens / now * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turnarounds-ms", default="0,5,20,50,100,200,300")
    args = parser.parse_args()
    offline = run(closed=False, turnaround_ms=0)
    served = {
        ms: round(run(closed=True, turnaround_ms=float(ms)) / offline, 3)
        for ms in args.turnarounds_ms.split(",")
    }
    print(
        json.dumps(
            {"offline_tok_s": round(offline), "served_over_offline_by_turnaround_ms": served}
        )
    )


if __name__ == "__main__":
    main()
