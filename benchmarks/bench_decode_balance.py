"""Decode attention load balance on one GPU: today's split plan vs fixed-length partitions
(kernels/decode_partition.py) vs the batch-invariant kernel, over batch sizes and context
mixes (uniform, random, the headline workload's decode steps), bf16 and fp8 caches, eager
and replayed from a CUDA graph captured for max_model_len 4096 (as the engine runs decode).

Prints one JSON line per (cache dtype, case), then one summary line per cache dtype with the
geometric-mean speedup of each plan over today's in graph mode and the suggested table
values. docs/kernels.md says how to read it. Usage:
python benchmarks/bench_decode_balance.py [--quick] [--partitions 256,512,1024]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import traceback

import torch
import triton
from workloads import headline

from minivllm.attention.batch_invariant import BatchInvariantAttention
from minivllm.kernels.batch_invariant_attention import batch_invariant_attention
from minivllm.kernels.decode_attention import decode_attention
from minivllm.kernels.decode_partition import (
    DEFAULT_POLICY,
    MAX_SPLITS,
    DecodePlan,
    choose_decode_plan,
    choose_num_splits,
)

# Qwen3-0.6B attention shapes; the engine's block size; the headline's max_model_len.
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, MAX_MODEL_LEN = 16, 8, 128, 16, 4096
FP8 = torch.float8_e4m3fn
BATCHES = (1, 8, 64, 256, 512)
HEADLINE_STEPS = (100, 400, 800)


def bench(fn, quick: bool) -> float:
    """Median milliseconds (L2 flushed between runs by do_bench)."""
    return triton.testing.do_bench(
        fn, warmup=5 if quick else 10, rep=20 if quick else 50, return_mode="median"
    )


def context_cases() -> list[tuple[str, list[int]]]:
    """(name, seq_lens): uniform and random mixes per batch size, then the headline's decode
    batches: prompt_len + k at decode step k for the requests still generating."""
    rng = random.Random(0)
    cases = []
    for b in BATCHES:
        cases.append((f"uniform1000_b{b}", [1000] * b))
        cases.append((f"random200-2000_b{b}", [rng.randint(200, 2000) for _ in range(b)]))
    work = headline()
    for k in HEADLINE_STEPS:
        lens = [len(p) + k for p, n in zip(work.prompts, work.output_lens, strict=True) if n > k]
        cases.append((f"headline_step{k}_b{len(lens)}", lens))
    return cases


def paged_cache(seq_lens: list[int], kv_dtype: torch.dtype):
    """Every context on its own blocks in a random order (a churned cache); values ~N(0, 1)."""
    counts = [triton.cdiv(n, BLOCK_SIZE) for n in seq_lens]
    shape = (2, sum(counts), BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16).to(kv_dtype)
    perm = torch.randperm(sum(counts), device="cuda", dtype=torch.int32)
    block_tables = torch.zeros(len(seq_lens), max(counts), dtype=torch.int32, device="cuda")
    start = 0
    for i, count in enumerate(counts):
        block_tables[i, :count] = perm[start : start + count]
        start += count
    return cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32, device="cuda")


def plans(batch: int, max_seq_len: int, elem: int, sms: int, parts: list[int]) -> dict:
    """name -> DecodePlan: today's (even split), the default policy's, each forced length."""
    out = {
        "today": DecodePlan(choose_num_splits(batch, NUM_KV_HEADS, max_seq_len, sms)),
        "default": choose_decode_plan(batch, NUM_KV_HEADS, max_seq_len, sms, elem),
    }
    for p in parts:
        out[f"p{p}"] = DecodePlan(min(MAX_SPLITS, triton.cdiv(max_seq_len, p)), p)
    return out


def graph_of(fn):
    """fn captured in a CUDA graph (compiled first, outside the capture)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def time_mode(launchers: dict, graph: bool, quick: bool, errors: dict) -> dict[str, float]:
    """ms per launcher; plans equal to an earlier one reuse its time. A launcher that fails
    (e.g. a tile config out of shared memory) goes to errors instead."""
    times, seen = {}, {}
    for name, (key, fn) in launchers.items():
        try:
            if key not in seen:
                seen[key] = bench(graph_of(fn).replay if graph else fn, quick)
            times[name] = seen[key]
        except Exception as exc:
            errors[name] = repr(exc)[:200]
    return times


def launchers_for(
    tensors: dict, plan_set: dict, bi: BatchInvariantAttention, max_len: int, configs: list
):
    """name -> (dedup key, fn) for every plan, today's and the default plan with each extra
    tile config (name@block_n,warps,stages), and the batch-invariant kernel."""
    q, cache, bt, lens, out, mid_o, mid_lse = (tensors[k] for k in
        ("q", "cache", "block_tables", "seq_lens", "out", "mid_o", "mid_lse"))  # fmt: skip
    scale = HEAD_DIM**-0.5

    def decode(plan: DecodePlan, config=None):
        return lambda: decode_attention(
            q, cache, bt, lens, scale, out, plan.num_splits, mid_o, mid_lse, config,
            partition_len=plan.partition_len,
        )  # fmt: skip

    result = {name: ((plan, None), decode(plan)) for name, plan in plan_set.items()}
    for config in configs:
        for name in ("today", "default"):
            tag = f"{name}@{','.join(map(str, config))}"
            result[tag] = ((plan_set[name], config), decode(plan_set[name], config))
    segments = bi.num_segments(len(lens), NUM_KV_HEADS, max_len)
    qsl = torch.arange(len(lens) + 1, dtype=torch.int32, device="cuda")
    scratch = {"part_acc": bi.part_acc, "part_m": bi.part_m, "part_l": bi.part_l}

    def batch_invariant():
        batch_invariant_attention(q, cache, qsl, lens, bt, scale, out, num_segments=segments,
                                  decode_rows=True, **(scratch if segments else {}))  # fmt: skip

    result["batch_invariant"] = (("bi", segments), batch_invariant)
    return result


def run_case(
    name: str, seq_lens: list[int], kv: str, parts: list[int], configs: list, quick: bool
) -> dict:
    kv_dtype = FP8 if kv == "fp8" else torch.bfloat16
    cache, block_tables, lens = paged_cache(seq_lens, kv_dtype)
    batch = len(seq_lens)
    tensors = {"q": torch.randn(batch, NUM_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
               "cache": cache, "block_tables": block_tables, "seq_lens": lens,
               "mid_o": torch.empty(batch, NUM_HEADS, MAX_SPLITS, HEAD_DIM, device="cuda"),
               "mid_lse": torch.empty(batch, NUM_HEADS, MAX_SPLITS, device="cuda")}  # fmt: skip
    tensors["out"] = torch.empty_like(tensors["q"])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bi = BatchInvariantAttention(batch, MAX_MODEL_LEN, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, sms,
                                 torch.device("cuda"))  # fmt: skip
    kv_bytes = sum(seq_lens) * NUM_KV_HEADS * HEAD_DIM * 2 * cache.element_size()
    line = {"kv": kv, "case": name, "batch": batch, "mean_ctx": round(sum(seq_lens) / batch),
            "max_ctx": max(seq_lens), "kv_MB": round(kv_bytes / 1e6, 1)}  # fmt: skip
    for mode, max_len in (("eager", max(seq_lens)), ("graph", MAX_MODEL_LEN)):
        plan_set = plans(batch, max_len, cache.element_size(), sms, parts)
        launchers = launchers_for(tensors, plan_set, bi, max_len, configs)
        errors = line.setdefault("errors", {})
        if mode == "eager":
            line["max_abs_err_vs_today"] = max_error(launchers, tensors["out"], errors)
        times = time_mode(launchers, mode == "graph", quick, errors)
        line[mode] = {
            v: {"plan": plan_list(plan_set.get(v.split("@")[0])),
                "ms": round(ms, 4), "tb_s": round(kv_bytes / ms / 1e9, 2),
                "speedup": round(times["today"] / ms, 3)}
            for v, ms in times.items()
        }  # fmt: skip
        line[f"best_{mode}"] = min(times, key=times.get)
    return line


def plan_list(plan: DecodePlan | None) -> list[int] | None:
    """[num_splits, partition_len] (partition_len 0: even split); None for batch_invariant."""
    return None if plan is None else [plan.num_splits, plan.partition_len]


def max_error(launchers: dict, out: torch.Tensor, errors: dict) -> float:
    """Largest |output - today's output| over every launcher (a wrong plan shows here)."""
    launchers["today"][1]()
    expected = out.float().clone()
    worst = 0.0
    for name, (_, fn) in launchers.items():
        try:
            fn()
        except Exception as exc:
            errors[name] = repr(exc)[:200]
            continue
        worst = max(worst, (out.float() - expected).abs().max().item())
    return round(worst, 5)


def geomean_speedups(rows: list[dict]) -> dict[str, float]:
    names = set.intersection(*(set(r) for r in rows))  # launchers that ran in every case
    return {v: round(math.exp(sum(math.log(r[v]["speedup"]) for r in rows) / len(rows)), 3)
            for v in sorted(names)}  # fmt: skip


def summarize(kv: str, lines: list[dict], parts: list[int]) -> dict:
    """Graph-mode geometric-mean speedups over today's plan, per batch size (the headline's
    steps together) and over every batch of at least one wave of (request, kv head)
    programs; the table values they suggest (decode_partition.DEFAULT_POLICY)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    by_batch: dict[str, list[dict]] = {}
    for line in lines:
        key = "headline" if line["case"].startswith("headline") else f"b{line['batch']}"
        by_batch.setdefault(key, []).append(line["graph"])
    geo = {key: geomean_speedups(rows) for key, rows in by_batch.items()}
    large = [ln["graph"] for ln in lines if ln["batch"] * NUM_KV_HEADS >= sms]
    geo_large = geomean_speedups(large) if large else {}
    best = max((f"p{p}" for p in parts), key=lambda v: geo_large.get(v, 0.0))
    # Smallest batch from which the best length beats today's plan, in waves of SMs.
    wins = [b for b in BATCHES if geo.get(f"b{b}", {}).get(best, 0.0) > 1.0]
    elem = 1 if kv == "fp8" else 2
    return {"kv": kv, "summary": "graph-mode geomean speedup vs today", "by_batch": geo,
            "large_batches": geo_large, "default_policy": {
                "partition_len": DEFAULT_POLICY.partition_len_for(elem),
                "balance_min_waves": DEFAULT_POLICY.balance_min_waves},
            "suggest": {"partition_len": [elem, int(best[1:])] if wins else [elem, 0],
                        "balance_min_waves": round(min(wins) * NUM_KV_HEADS / sms, 2)
                        if wins else None}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter timing runs")
    parser.add_argument("--partitions", default="256,512,1024", help="candidate lengths")
    parser.add_argument("--kv", default="bf16,fp8", help="cache dtypes: bf16,fp8")
    parser.add_argument(
        "--configs",
        default="128,4,4",
        help="extra decode tile configs block_n,warps,stages separated by ';' (the batch-"
        "invariant kernel's decode tile is 128,4,4); '' for none",
    )
    args = parser.parse_args()
    parts = [int(p) for p in args.partitions.split(",")]
    configs = [tuple(int(x) for x in c.split(",")) for c in args.configs.split(";") if c]
    for kv in args.kv.split(","):
        lines = []
        for name, seq_lens in context_cases():
            try:
                lines.append(run_case(name, seq_lens, kv, parts, configs, args.quick))
                print(json.dumps(lines[-1]), flush=True)
            except Exception as exc:  # a failing case prints an error line; the run goes on
                traceback.print_exc()
                print(json.dumps({"kv": kv, "case": name, "error": repr(exc)}), flush=True)
        if lines:
            print(json.dumps(summarize(kv, lines, parts)), flush=True)


if __name__ == "__main__":
    main()
