"""A model of how long a workload's prefill attention launches take against their bound, on
the CPU: the engine's Scheduler runs the workload (benchmarks/workloads.py) with a stand-in
runner until every prompt is prefilled, and each step's query tiles (128 rows, the Gluon
kernel's) go, in the kernels' program order (tiles last-first; one KV head's programs
together), to whichever of the GPU's SMs frees first, one program an SM at a time. A tile
costs its 128-key blocks plus half a block of fixed work. The bound spreads a launch's work
evenly over the SMs. Prints one JSON line: the modelled time over the bound, summed over the
steps, in the scheduler's packing and with running requests' chunks packed before new ones.

    python -m benchmarks.kernels.prefill_dispatch_model [--workload long] [--usage offline|server]
        [--sms 132]

The scheduler's limits are the engine's defaults on an H100 or H200 for the usage.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math

from benchmarks.workloads import WORKLOADS, make_workload
from minivllm.engine.sched.kv.block_manager import BlockManager
from minivllm.engine.sched.limits import LARGE_GPU_BYTES, auto_scheduler_limits
from minivllm.engine.sched.request import Request
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.engine.types import RunnerOutput, SchedulerOutput
from minivllm.kernels.gluon_prefill_attention import BLOCK_M as TILE_ROWS
from minivllm.sampling_params import SamplingParams

KEY_BLOCK = 128  # keys a step of the kernel's loop (its BLOCK_N at head_dim 128)
KV_BLOCK_SIZE = 16  # the engine's default block_size
TILE_FIXED = 0.5  # a program's own work, in key blocks
NUM_HEADS, GROUP = 16, 2  # Qwen3-0.6B: 16 query heads, 8 KV heads


def tile_costs(chunks: list[tuple[int, int]]) -> list[float]:
    """(query_len, context before it) per packed chunk -> each tile's cost, in tile-id order."""
    costs = []
    for query_len, context in chunks:
        for t0 in range(0, query_len, TILE_ROWS):
            keys = context + min(t0 + TILE_ROWS, query_len)
            costs.append(math.ceil(keys / KEY_BLOCK) + TILE_FIXED)
    return costs


def launch_time(chunks: list[tuple[int, int]], sms: int) -> tuple[float, float]:
    """(modelled time, bound) of one launch: programs of one KV head together, each head's
    tiles last-first (its GROUP query heads side by side), handed to the first free SM."""
    costs = tile_costs(chunks)
    free_at = [0.0] * sms
    for _ in range(NUM_HEADS // GROUP):
        for cost in reversed(costs):
            for _ in range(GROUP):
                heapq.heappush(free_at, heapq.heappop(free_at) + cost)
    return max(free_at), NUM_HEADS * sum(costs) / sms


def prefill_chunks(sched_out: SchedulerOutput, running_first: bool) -> list[tuple[int, int]]:
    chunks = sched_out.chunks[sched_out.num_decode_chunks :]
    if running_first:
        new = {r.req_id for r in sched_out.new_requests}
        chunks = [c for c in chunks if c.req_id not in new] + [c for c in chunks if c.req_id in new]
    return [(len(c.token_ids), c.num_computed_tokens) for c in chunks]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="long", choices=WORKLOADS)
    parser.add_argument("--usage", default="offline", choices=["offline", "server"])
    parser.add_argument("--sms", type=int, default=132, help="an H100 or H200: 132")
    args = parser.parse_args()
    limits = auto_scheduler_limits(LARGE_GPU_BYTES, "cuda", args.usage)
    workload = make_workload(args.workload)
    tokens = workload.num_prompt_tokens + workload.num_output_tokens
    num_blocks = tokens // KV_BLOCK_SIZE + len(workload.prompts) + 1  # never preempts
    blocks = BlockManager(num_blocks, KV_BLOCK_SIZE, False)
    scheduler = Scheduler(*limits, workload.max_model_len, blocks)
    for i, (prompt, out_len) in enumerate(zip(workload.prompts, workload.output_lens)):
        params = SamplingParams(max_tokens=out_len, ignore_eos=True)
        scheduler.add_request(Request(str(i), prompt, params, arrival_time=0.0))
    totals = {"packed": 0.0, "running_first": 0.0, "bound": 0.0}
    steps = 0
    while True:
        sched_out = scheduler.schedule()
        if len(sched_out.chunks) == sched_out.num_decode_chunks:
            break  # every prompt prefilled
        steps += 1
        for order in ("packed", "running_first"):
            time, bound = launch_time(prefill_chunks(sched_out, order != "packed"), args.sms)
            totals[order] += time
        totals["bound"] += bound
        req_ids = [c.req_id for c in sched_out.chunks if c.sample]
        scheduler.update(sched_out, RunnerOutput(req_ids, [7] * len(req_ids)))
    print(
        json.dumps(
            {
                "bench": "prefill_dispatch_model",
                "workload": args.workload,
                "usage": args.usage,
                "sms": args.sms,
                "steps": steps,
                "packed_over_bound": round(totals["packed"] / totals["bound"], 4),
                "running_first_over_bound": round(totals["running_first"] / totals["bound"], 4),
            }
        )
    )


if __name__ == "__main__":
    main()
