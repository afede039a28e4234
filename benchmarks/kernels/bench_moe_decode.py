"""The fused MoE's small-step GEMVs (kernels/moe/gemv.py) against its grouped GEMMs at decode
step sizes (1 to 16 tokens) at Qwen3-30B-A3B's expert shapes (128 experts, top-8, hidden 2048,
intermediate 768; --tp 2 halves it), bf16 and block FP8. Each path runs under a CUDA graph, as
the engine replays decode steps (eager launches would time the host), over 16 steps with
different routes in a row, so one step's experts are not in L2 for the next. Per step size:
each path's time a step, the touched experts' bytes (weights and scales, read once) over that
time, the largest difference between the paths. --tune: the fastest GEMV tiles instead of the
rule's (kernels/moe/configs.py gemv_config), gate/up's first, then down's.

Prints one JSON line. Usage:
  python -m benchmarks.kernels.bench_moe_decode [--tokens 1,2,4,8,16] [--tp 2] [--tune]
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import replace

import torch
import triton

from benchmarks.kernels.bench_moe import INTER, TOP_K, E, H, expert_blocks, make_case
from minivllm.kernels.moe.configs import GemvTile, gemv_config, moe_config
from minivllm.kernels.moe.fused_moe import fused_moe
from minivllm.layers.moe_router import route

STEPS = 16  # routes a graph replays in a row


def experts(num_tokens: int, inter: int, fp8: bool):
    """x, (w13, w2), their scales (or Nones), bytes a weight element takes, STEPS routes."""
    x, w13, w2, _, _ = make_case(num_tokens, inter)
    scales, elem_bytes = (None, None), 2.0
    if fp8:
        (w13, w13s), (w2, w2s) = expert_blocks(w13), expert_blocks(w2)
        scales, elem_bytes = (w13s, w2s), 1 + 4 / 128**2
    g = torch.Generator("cuda").manual_seed(1)
    routes = [route(torch.randn(num_tokens, E, device="cuda", generator=g), TOP_K, True)
              for _ in range(STEPS)]  # fmt: skip
    return x, (w13, w2), scales, elem_bytes, routes


def step_ms(x, weights, scales, routes, config, rep: int = 100) -> float:
    """A step's GPU time: the STEPS routes in one CUDA graph, median over replays."""

    def steps() -> None:
        for topk_weights, topk_ids in routes:
            fused_moe(x, *weights, topk_weights, topk_ids, config, *scales)

    return triton.testing.do_bench_cudagraph(steps, rep=rep, return_mode="median") / STEPS


def row(num_tokens: int, inter: int, fp8: bool) -> dict:
    x, weights, scales, elem_bytes, routes = experts(num_tokens, inter, fp8)
    used = sum(int(torch.unique(ids).numel()) for _, ids in routes) / STEPS
    expert_bytes = used * 3 * H * inter * elem_bytes
    result = {"tokens": num_tokens, "experts_used": used, "expert_mb": round(expert_bytes / 1e6, 1)}
    configs = {"gemv": gemv_config(x.dtype, fp8),
               "grouped": moe_config(x.dtype, (E, H, inter, TOP_K), num_tokens)}  # fmt: skip
    outs = {}
    for name, config in configs.items():
        ms = step_ms(x, weights, scales, routes, config)
        result[f"{name}_ms"] = round(ms, 4)
        result[f"{name}_gb_per_s"] = round(expert_bytes / ms / 1e6, 1)
        outs[name] = fused_moe(x, *weights, *routes[0], config, *scales).float()
    result["speedup"] = round(result["grouped_ms"] / result["gemv_ms"], 3)
    result["max_abs_diff"] = round((outs["gemv"] - outs["grouped"]).abs().max().item(), 5)
    return result


def tune(num_tokens: int, inter: int, fp8: bool) -> dict:
    """The fastest GEMV tiles at a step size: gate/up's with down at the rule's, then down's."""
    x, weights, scales, _, routes = experts(num_tokens, inter, fp8)
    best = rule = gemv_config(x.dtype, fp8)
    for part in ("gate_up", "down"):
        timed = []
        for n, k, warps, stages in itertools.product(
            (4, 8, 16, 32), (128,) if fp8 else (128, 256, 512), (4, 8), (2, 3)
        ):
            config = replace(best, **{part: GemvTile(n, k, warps, stages)})
            timed.append((step_ms(x, weights, scales, routes, config, rep=20), config))
        best = min(timed, key=lambda t: t[0])[1]
    return {
        "tokens": num_tokens, "ms": round(step_ms(x, weights, scales, routes, best), 4),
        "rule_ms": round(step_ms(x, weights, scales, routes, rule), 4), "config": repr(best),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,2,4,8,16")
    parser.add_argument("--tp", type=int, default=1, help="intermediate split over this many ranks")
    parser.add_argument("--tune", action="store_true", help="sweep the GEMV tiles instead")
    args = parser.parse_args()
    inter, tokens = INTER // args.tp, [int(t) for t in args.tokens.split(",")]
    result = {"case": "moe_decode", "experts": E, "top_k": TOP_K, "hidden": H, "inter": inter,
              "graph_steps": STEPS}  # fmt: skip
    for name, fp8 in (("bf16", False), ("fp8", True)):
        result[name] = [(tune if args.tune else row)(t, inter, fp8) for t in tokens]
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
