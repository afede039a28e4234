"""Gluon (FA3-style, Hopper) against Triton causal prefill attention on one prompt of L tokens:
16 q / 8 kv heads, head_dim 128, bf16, a paged cache of 16-token blocks in shuffled order.
TFLOP/s counts causal flops, 4 * L^2 / 2 * head_dim * num_heads; times are the median of
CUDA-event timings after a warm-up. Prints one JSON line (config, then one entry per L).

    python -m benchmarks.kernels.bench_gluon_prefill [--lens 4096,8192,16384] [--iters 30]
        [--gluon-configs 128:2:0,128:3:1:0]   # block_n:num_stages:pingpong[:kv_head_major],
                                              # each timed too
        [--launch]   # also µs a call of each kernel launched back to back with no sync, where
                     # small prompts are bound by the launch's host time
        [--launch-profile]  # also where a launch's host time goes: the functions with the
                            # most own time, µs a call (cProfile over launches back to back)
        [--deterministic]   # also deterministic mode's two prefill kernels: the Triton walk
                            # and the Gluon kernel of the same bits (checked equal)
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from functools import partial

import torch
import triton

from minivllm.kernels.batch_invariant_attention import batch_invariant_attention
from minivllm.kernels.gluon_batch_invariant_attention import gluon_batch_invariant_attention
from minivllm.kernels.gluon_prefill_attention import gluon_prefill_attention
from minivllm.kernels.prefill_attention import prefill_attention

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, DTYPE = 16, 8, 128, 16, torch.bfloat16


def time_ms(fn, warmup: int, iters: int) -> float:
    """Median milliseconds of fn over iters runs, each between two CUDA events."""
    for _ in range(warmup):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]  # fmt: skip
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return sorted(start.elapsed_time(end) for start, end in events)[iters // 2]


def launch_us(fn, iters: int = 200) -> float:
    """Microseconds a call of fn launched back to back, no sync between calls: the larger of
    its host time and its device time."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e6


def host_profile(fn, iters: int = 300, top: int = 10) -> list[tuple[str, float]]:
    """The `top` functions by own host time over iters calls of fn launched back to back,
    each with its microseconds a call of fn (cProfile adds its own cost to every function)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(iters):
        fn()
    profile.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profile).stats  # (file, line, name) -> (calls, ncalls, own, cum, callers)
    ranked = sorted(stats.items(), key=lambda item: -item[1][2])[:top]
    return [
        (f"{file.rsplit('/', 1)[-1]}:{line}({name})", round(own / iters * 1e6, 1))
        for (file, line, name), (_, _, own, *_) in ranked
    ]


def prompt_case(seq_len: int, gen: torch.Generator) -> tuple:
    """Arguments of both launchers for one whole prompt of seq_len tokens, its cache blocks a
    random permutation (a churned cache)."""
    num_blocks = triton.cdiv(seq_len, BLOCK_SIZE)
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, device="cuda",
                        generator=gen).to(DTYPE)  # fmt: skip
    block_tables = torch.randperm(num_blocks, device="cuda", generator=gen).int()[None]
    q = torch.randn(seq_len, NUM_HEADS, HEAD_DIM, device="cuda", generator=gen).to(DTYPE)
    qsl = torch.tensor([0, seq_len], dtype=torch.int32, device="cuda")
    seq_lens = torch.tensor([seq_len], dtype=torch.int32, device="cuda")
    return q, cache, qsl, seq_lens, block_tables, HEAD_DIM**-0.5


def bench_len(
    seq_len: int,
    gen: torch.Generator,
    overrides,
    warmup: int,
    iters: int,
    launch: bool,
    launch_profile: bool = False,
    deterministic: bool = False,
) -> dict:
    """Both kernels on one prompt of seq_len tokens; overrides: (block_n, num_stages, pingpong[,
    kv_head_major]) settings of the Gluon kernel to time as well."""
    inputs = prompt_case(seq_len, gen)
    out_triton, out_gluon = torch.empty_like(inputs[0]), torch.empty_like(inputs[0])
    flops = 4 * seq_len**2 / 2 * HEAD_DIM * NUM_HEADS
    triton_ms = time_ms(partial(prefill_attention, *inputs, out_triton), warmup, iters)
    gluon_ms = time_ms(partial(gluon_prefill_attention, *inputs, out_gluon), warmup, iters)
    row = {
        "seq_len": seq_len,
        "triton_ms": round(triton_ms, 4),
        "triton_tflop_per_s": round(flops / triton_ms / 1e9, 1),
        "gluon_ms": round(gluon_ms, 4),
        "gluon_tflop_per_s": round(flops / gluon_ms / 1e9, 1),
        "speedup": round(triton_ms / gluon_ms, 3),
        "max_abs_diff": (out_gluon.float() - out_triton.float()).abs().max().item(),
    }
    if launch:
        row["triton_launch_us"] = round(
            launch_us(partial(prefill_attention, *inputs, out_triton)), 1
        )
        row["gluon_launch_us"] = round(
            launch_us(partial(gluon_prefill_attention, *inputs, out_gluon)), 1
        )
    if launch_profile:
        row["triton_launch_profile_us"] = host_profile(
            partial(prefill_attention, *inputs, out_triton)
        )
        row["gluon_launch_profile_us"] = host_profile(
            partial(gluon_prefill_attention, *inputs, out_gluon)
        )
    if deterministic:
        out_walk, out_bi = torch.empty_like(inputs[0]), torch.empty_like(inputs[0])
        walk_ms = time_ms(partial(batch_invariant_attention, *inputs, out_walk), warmup, iters)
        bi_ms = time_ms(partial(gluon_batch_invariant_attention, *inputs, out_bi), warmup, iters)
        row["bi_triton_tflop_per_s"] = round(flops / walk_ms / 1e9, 1)
        row["bi_gluon_tflop_per_s"] = round(flops / bi_ms / 1e9, 1)
        row["bi_bits_equal"] = torch.equal(out_walk, out_bi)
        if launch:
            row["bi_gluon_launch_us"] = round(
                launch_us(partial(gluon_batch_invariant_attention, *inputs, out_bi)), 1
            )
    for config in overrides:
        block_n, num_stages, pingpong, *order = config  # no order given: the launcher's rule
        fn = partial(gluon_prefill_attention, *inputs, out_gluon, block_n=block_n,
                     num_stages=num_stages, pingpong=bool(pingpong),
                     kv_head_major=bool(order[0]) if order else None)  # fmt: skip
        ms = time_ms(fn, warmup, iters)
        name = ":".join(map(str, config))
        row[f"gluon_{name}_tflop_per_s"] = round(flops / ms / 1e9, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lens", default="4096,8192,16384")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument(
        "--gluon-configs", default="", help="block_n:num_stages:pingpong[:kv_head_major],..."
    )
    parser.add_argument("--launch", action="store_true", help="also µs a call back to back")
    parser.add_argument(
        "--launch-profile", action="store_true", help="also the launch's host time by function"
    )
    parser.add_argument(
        "--deterministic", action="store_true", help="also deterministic mode's two kernels"
    )
    args = parser.parse_args()
    overrides = [tuple(map(int, c.split(":"))) for c in args.gluon_configs.split(",") if c]
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases = []
    for seq_len in map(int, args.lens.split(",")):
        cases.append(
            bench_len(
                seq_len,
                gen,
                overrides,
                args.warmup,
                args.iters,
                args.launch,
                args.launch_profile,
                args.deterministic,
            )
        )
        torch.cuda.empty_cache()
    result = {
        "bench": "gluon_prefill",
        "gpu": torch.cuda.get_device_name(),
        "triton": triton.__version__,
        "heads": f"{NUM_HEADS}/{NUM_KV_HEADS}",
        "head_dim": HEAD_DIM,
        "dtype": str(DTYPE).removeprefix("torch."),
        "block_size": BLOCK_SIZE,
        "cases": cases,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
