"""Where a prefill step's time goes: wall time of one engine step that prefills a prompt (alone,
or joining running decodes, the step behind serving's p99 inter-token latency) against GPU
kernel time and the number of kernel launches (torch.profiler). Dummy Qwen3-0.6B weights.
Prints one JSON line per case.

python benchmarks/profile_prefill.py [--prompt-len 1000] [--decodes 0 16 128]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

from common import dummy_model_dir


def _prompt(i: int, n: int) -> list[int]:
    return [(i * 7919 + j * 31) % 10000 for j in range(n)]


def _step_until_decoding(engine, num: int) -> None:
    while len(engine.scheduler.running) < num or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running
    ):
        engine.step()


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profile_case(llm, prompt_len: int, decodes: int, tag: int, rounds: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from minivllm import SamplingParams

    engine = llm.engine
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=4 * rounds + 64)
    for i in range(decodes):
        engine.add_request(f"d{tag}-{i}", _prompt(i, 200), params)
    _step_until_decoding(engine, decodes)
    walls, kernel_ms, launches = [], [], []
    for r in range(rounds):
        engine.add_request(f"p{tag}-{r}", _prompt(10_000 + tag * 100 + r, prompt_len), params)
        _sync()
        profiled = r == rounds - 1
        start = time.perf_counter()
        if profiled:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                engine.step()
                engine.step()  # async scheduling: the step after returns the prefill's token
                _sync()
        else:
            engine.step()
            engine.step()
            _sync()
        walls.append((time.perf_counter() - start) * 1e3)
        if profiled:
            kernels: dict[str, float] = defaultdict(float)
            count = 0
            for event in prof.events():
                if event.device_type == torch.autograd.DeviceType.CUDA:
                    kernels[event.name[:50]] += event.device_time / 1e3
                    count += 1
            kernel_ms.append(sum(kernels.values()))
            launches.append(count)
            top = sorted(kernels.items(), key=lambda kv: -kv[1])[:8]
    for req in list(engine.scheduler.running) + list(engine.scheduler.waiting):
        engine.abort_requests([req.req_id])
    while engine.has_unfinished_requests():
        engine.step()
    walls.sort()
    return {
        "bench": "profile_prefill",
        "prompt_len": prompt_len,
        "decodes": decodes,
        "wall_ms_two_steps_median": round(walls[len(walls) // 2], 3),
        "wall_ms_min": round(walls[0], 3),
        "gpu_kernel_ms_profiled": round(kernel_ms[-1], 3),
        "kernel_launches": launches[-1],
        "top_kernels_ms": {k: round(v, 3) for k, v in top},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-name", default="qwen3-0.6b")
    parser.add_argument("--prompt-len", type=int, default=1000)
    parser.add_argument("--decodes", type=int, nargs="+", default=[0, 16, 128])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from minivllm import LLM

    llm = LLM(
        dummy_model_dir(args.model_name),
        load_format="dummy",
        max_model_len=4096,
        enable_prefix_caching=False,
    )
    for tag, decodes in enumerate(args.decodes):
        print(json.dumps(profile_case(llm, args.prompt_len, decodes, tag, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
