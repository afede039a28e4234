"""Where a whole workload's GPU time goes: one `LLM.generate` of a workload from
benchmarks/workloads.py under torch.profiler (CUDA activity only, graph replays included),
kernel time summed by kind (prefill attention, decode attention, GEMM, sampler, the rest)
against the wall time. Dummy Qwen3-0.6B weights. Prints one JSON line.

python -m benchmarks.engine.profile_workload long [--num-requests N] [--kv-cache-dtype fp8]
    [--deterministic]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

from benchmarks.common import dummy_model_dir
from benchmarks.workloads import WORKLOADS, make_workload, shifted

# Kernel name fragment -> kind; the first match wins (cuBLAS / CUTLASS GEMMs go by many names).
KINDS = (
    ("_bi_attention_kernel", "invariant_attention"),  # deterministic mode's attention
    ("_fold_kernel", "invariant_attention"),
    ("_prefill_kernel", "prefill_attention"),
    ("_decode_kernel", "decode_attention"),
    ("_reduce_kernel", "reduce_split_kv_or_sampler"),  # both modules have a kernel of this name
    ("gemm", "gemm"),
    ("splitkreduce", "gemm"),  # cuBLAS's split-K reduce, part of a GEMM
    ("nvjet", "gemm"),
    ("cutlass", "gemm"),
    ("xmma", "gemm"),
    ("_matmul_kernel", "gemm"),
    ("sampl", "sampler"),
    ("_chunk_max", "sampler"),
    ("_chunk_top", "sampler"),  # the filters' thresholds (kernels/filter_thresholds.py)
    ("_threshold_kernel", "sampler"),
    ("topk", "sampler"),  # torch.topk's kernels (gatherTopK, radix select, bitonic sort)
    ("radix", "sampler"),
    ("bitonic", "sampler"),
    ("penalt", "sampler"),
    ("softmax", "sampler"),
    ("scatter", "sampler"),
    ("rope", "rope_kv_store"),
    ("store_kv", "rope_kv_store"),
    ("rms", "norm"),
    ("silu", "activation"),
)


def kind_of(name: str) -> str:
    lower = name.lower()
    for fragment, kind in KINDS:
        if fragment.lower() in lower:
            return kind
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=WORKLOADS)
    parser.add_argument("--num-requests", type=int, default=None)
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--deterministic", action="store_true", help="batch-invariant numerics")
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from minivllm import LLM, SamplingParams

    workload = make_workload(args.workload, args.num_requests)
    llm = LLM(
        dummy_model_dir("qwen3-0.6b"),
        load_format="dummy",
        max_model_len=workload.max_model_len,
        kv_cache_dtype=args.kv_cache_dtype,
        deterministic=args.deterministic,
    )
    # The workload's sampling options (chat's top-k/top-p, penalties, logprobs...), else
    # temperature 0.6 as the throughput benchmarks sample.
    sampling = workload.sampling or [{"temperature": 0.6}] * workload.num_requests
    params = [
        SamplingParams(ignore_eos=True, max_tokens=n, **options)
        for n, options in zip(workload.output_lens, sampling, strict=True)
    ]
    # Three runs of the same shape (warm-up, timed, profiled) on shifted token ids, so that no
    # run finds the previous run's prompts in the prefix cache.
    runs = [
        [{"prompt_token_ids": p} for p in shifted(workload, shift).prompts] for shift in (1, 2, 3)
    ]
    llm.generate(runs[0], params, use_tqdm=False)
    torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate(runs[1], params, use_tqdm=False)
    torch.cuda.synchronize()
    unprofiled = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate(runs[2], params, use_tqdm=False)
        torch.cuda.synchronize()
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, float] = defaultdict(float)
    launches = 0
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        ms = event.device_time / 1e3
        by_kind[kind_of(event.name)] += ms
        by_name[event.name[:70]] += ms
        launches += 1
    gpu_ms = sum(by_kind.values())
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[: args.top]
    print(
        json.dumps(
            {
                "bench": "profile_workload",
                "workload": workload.name,
                "kv_cache_dtype": args.kv_cache_dtype,
                "deterministic": args.deterministic,
                "wall_s_unprofiled": round(unprofiled, 3),
                "gpu_kernel_s": round(gpu_ms / 1e3, 3),
                "kernels": launches,
                "by_kind_s": {k: round(v / 1e3, 3) for k, v in sorted(by_kind.items())},
                "top_kernels_s": {k: round(v / 1e3, 3) for k, v in top},
            }
        ),
        flush=True,
    )
    llm.shutdown()


if __name__ == "__main__":
    main()
