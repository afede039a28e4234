"""Where a decode step's time goes: wall time per step against GPU kernel time per step, and
the kernels that take it (torch.profiler). 256 sequences at ~1,000 tokens of context, dummy
Qwen3-0.6B weights. Prints one JSON line."""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

from benchmarks.common import dummy_model_dir


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-name", default="qwen3-0.6b")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--context", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--no-async-scheduling", action="store_true")
    # Under TP the profile shows rank 0's kernels; the workers run the same ones.
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--kv-cache-dtype", default="auto")
    # Split-KV partitions for every decode step (graphs included) instead of the launcher's rule.
    parser.add_argument("--num-splits", type=int, default=None)
    args = parser.parse_args()
    if args.num_splits is not None:
        from minivllm.attention.triton import TritonBackend

        TritonBackend.num_splits = lambda self, *_: args.num_splits

    import torch
    from torch.profiler import ProfilerActivity, profile

    from minivllm import LLM, SamplingParams
    from minivllm.engine.types import EngineRequest

    model_dir = dummy_model_dir(args.model_name)
    llm = LLM(
        model_dir,
        load_format="dummy",
        max_model_len=max(args.max_model_len, args.context + 2600),
        async_scheduling=not args.no_async_scheduling,
        tensor_parallel_size=args.tensor_parallel_size,
        deterministic=args.deterministic,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    engine = llm.engine
    params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=10_000 // 4)
    for i in range(args.batch):
        prompt = [(i * 7919 + j) % 10000 for j in range(args.context)]
        engine.add_requests([EngineRequest(f"p{i}", prompt, params, time.time())])
    while len(engine.scheduler.running) < args.batch or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running
    ):
        engine.step()
    for _ in range(10):
        engine.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / args.steps
    kernels: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name[:60]] += event.device_time / 1e3 / args.steps
    gpu_ms = sum(kernels.values())
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:15]
    print(
        json.dumps(
            {
                "bench": "profile_decode",
                "batch": args.batch,
                "context": args.context,
                "async_scheduling": not args.no_async_scheduling,
                "tp": args.tensor_parallel_size,
                "deterministic": args.deterministic,
                "kv_cache_dtype": args.kv_cache_dtype,
                "num_splits": args.num_splits,
                "wall_ms_per_step_profiled": round(wall * 1e3, 3),
                "gpu_kernel_ms_per_step": round(gpu_ms, 3),
                "top_kernels_ms_per_step": {k: round(v, 3) for k, v in top},
            }
        ),
        flush=True,
    )
    # Unprofiled wall time per step, for the fixed cost (step time minus kernel time).
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / args.steps
    print(
        json.dumps(
            {
                "bench": "decode_step",
                "wall_ms_per_step": round(wall * 1e3, 3),
                "fixed_ms_per_step": round(wall * 1e3 - gpu_ms, 3),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
