"""The Gated DeltaNet kernels on one GPU at Qwen3.5-9B's linear-attention shapes (16 q/k heads,
32 value heads, head dims 128, conv over 8,192 channels), bf16: the chunked prefill (total and
per kernel, from the profiler) over a few packings of prompts, the decode step's bandwidth on
its float32 states against a device copy of as many bytes, and the conv's prefill and update.

Prints one JSON line per case. Usage: python -m benchmarks.kernels.bench_gated_delta [--quick]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch
import triton
from torch.profiler import ProfilerActivity, profile

from minivllm.kernels.gated_delta import conv1d, decode, prefill
from minivllm.kernels.gated_delta.chunk_layout import chunk_layout

H_K, H_V, D, WIDTH = 16, 32, 128, 4
CHANNELS = (2 * H_K + H_V) * D


def bench(fn, quick: bool) -> float:
    """Median milliseconds (L2 flushed between runs by do_bench)."""
    return triton.testing.do_bench(
        fn, warmup=10 if quick else 25, rep=30 if quick else 200, return_mode="median"
    )


def per_kernel_ms(fn, runs: int = 10) -> dict[str, float]:
    """Device milliseconds a call of each kernel fn launches, from the profiler."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time / 1e3 / runs
    return {name: round(ms, 4) for name, ms in totals.items() if "_kernel" in name}


def rule_inputs(num_tokens: int, num_slots: int):
    qkv = torch.randn(num_tokens, CHANNELS, device="cuda", dtype=torch.bfloat16)
    q = qkv[:, : H_K * D].view(num_tokens, H_K, D)
    k = qkv[:, H_K * D : 2 * H_K * D].view(num_tokens, H_K, D)
    v = qkv[:, 2 * H_K * D :].view(num_tokens, H_V, D)
    g = -torch.rand(num_tokens, H_V, device="cuda") * 0.1
    beta = torch.rand(num_tokens, H_V, device="cuda", dtype=torch.bfloat16)
    state = torch.zeros(num_slots, H_V, D, D, device="cuda")
    return qkv, q, k, v, g, beta, state


def prefill_case(lens: list[int], quick: bool) -> dict:
    n, total = len(lens), sum(lens)
    qkv, q, k, v, g, beta, state = rule_inputs(total, n)
    bounds = [0, *torch.tensor(lens).cumsum(0).tolist()]
    cu = torch.tensor(bounds, dtype=torch.int32, device="cuda")
    layout = chunk_layout(bounds, "cuda")
    slots = torch.arange(n, dtype=torch.int32, device="cuda")
    has_init = torch.zeros(n, dtype=torch.bool, device="cuda")
    rule = lambda: prefill.gated_delta_rule_prefill(  # noqa: E731
        q, k, v, g, beta, cu, state, slots, has_init, use_qk_l2norm=True, layout=layout
    )
    weight = torch.randn(CHANNELS, WIDTH, device="cuda", dtype=torch.bfloat16)
    conv_state = torch.zeros(n, WIDTH - 1, CHANNELS, device="cuda", dtype=torch.bfloat16)
    conv = lambda: conv1d.causal_conv1d_prefill(  # noqa: E731
        qkv, weight, None, cu, conv_state, slots, has_init, layout=layout
    )
    ms = bench(rule, quick)
    return {
        "case": "prefill", "seqs": n, "tokens": total, "rule_ms": round(ms, 4),
        "tokens_per_s": round(total / ms * 1e3), "kernels_ms": per_kernel_ms(rule),
        "conv_ms": round(bench(conv, quick), 4),
    }  # fmt: skip


def decode_case(batch: int, quick: bool) -> dict:
    qkv, q, k, v, g, beta, state = rule_inputs(batch, batch)
    slots = torch.randperm(batch, device="cuda").to(torch.int32)
    ms = bench(lambda: decode.gated_delta_rule_decode(
        q, k, v, g, beta, state, slots, use_qk_l2norm=True
    ), quick)  # fmt: skip
    state_bytes = 2 * state.numel() * 4  # read and written
    src = torch.empty(state.numel() * 4, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = bench(lambda: dst.copy_(src), quick)
    weight = torch.randn(CHANNELS, WIDTH, device="cuda", dtype=torch.bfloat16)
    conv_state = torch.zeros(batch, WIDTH - 1, CHANNELS, device="cuda", dtype=torch.bfloat16)
    conv_ms = bench(lambda: conv1d.causal_conv1d_update(
        qkv, weight, None, conv_state, slots
    ), quick)  # fmt: skip
    return {
        "case": "decode", "batch": batch, "rule_ms": round(ms, 4),
        "state_tb_per_s": round(state_bytes / ms / 1e9, 3),
        "copy_tb_per_s": round(state_bytes / copy_ms / 1e9, 3), "conv_update_ms": round(conv_ms, 4),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    device = torch.cuda.get_device_name()
    for lens in ([8192], [1024] * 8, [512] * 16, [64] * 64, [16384]):
        print(json.dumps({"device": device, **prefill_case(lens, args.quick)}), flush=True)
    for batch in (1, 16, 64, 256):
        print(json.dumps({"device": device, **decode_case(batch, args.quick)}), flush=True)


if __name__ == "__main__":
    main()
