"""The headline workload with every request under a JSON schema, through either engine's
vLLM-style API, against the same run unconstrained; and batch-1 TTFT with a cached grammar.
Prints one JSON line.

    python -m benchmarks.engine.bench_structured make DIR   # Qwen3-0.6B shape, SmolLM2's tokenizer
    python -m benchmarks.engine.bench_structured run minivllm DIR [--unconstrained] [--sync]
        [--phases] [--gpu-profile] [--served-shape [--input-len N]] [--disable-any-whitespace]
    PYTHONPATH=/tmp/vsite python -m benchmarks.engine.bench_structured run vllm DIR \
        [--backend guidance]

vLLM logs its shutdown to stdout after the JSON line: keep the line with `grep '"engine"'`.

DIR: a dummy-weights Qwen3-0.6B-shaped model directory whose tokenizer is a real byte-level BPE
(the demo GGUF's, 49,152 tokens; `vocab_size` set to match): with the word-level tokenizer of
make_dummy_model.py vLLM's xgrammar ends every constrained request after one token and its
guidance backend refuses it. The random weights make the grammar do all the work.

--served-shape: instead of the headline, the serving benchmark's requests offline (512 prompts of
1,000 random ids, 200 greedy output tokens) at the server's limits (128 sequences in flight, as
its clients, and 8,192 tokens a step): bench_serving.py's shape without the server, so that
--phases and --gpu-profile can look at it.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import pstats
import statistics
import sys
import time

from benchmarks.engine.step_phases import StepPhases
from benchmarks.workloads import Workload, make_workload, random_prompts, result_fields

# The serving benchmark's shape (bench_serving.py's defaults) and the server's limits.
SERVED_SHAPE = dict(num_prompts=512, input_len=1000, output_len=200)
SERVED_LIMITS = dict(max_num_seqs=128, max_num_batched_tokens=8192)

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "score": {"type": "integer"},
    },
    "required": ["name", "tags", "score"],
}
QWEN3_0_6B = dict(
    architectures=["Qwen3ForCausalLM"],
    model_type="qwen3",
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=True,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_theta=1000000,
    hidden_act="silu",
    attention_bias=False,
    torch_dtype="bfloat16",
)


def make(out_dir: str) -> None:
    from minivllm.demo_model import demo_gguf_file
    from minivllm.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(demo_gguf_file())
    tokenizer.save_pretrained(out_dir)
    config = dict(QWEN3_0_6B, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id)
    config["bos_token_id"] = tokenizer.bos_token_id
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(out_dir)


def build(
    engine: str,
    model_dir: str,
    backend: str | None,
    sync: bool = False,
    limits: dict | None = None,
    compact: bool = False,
):
    """(llm, params factory (max_tokens, constrained) -> SamplingParams). sync: minivllm
    without async scheduling; limits: scheduler limits (max_num_seqs, ...) for either engine;
    compact: the schema with disable_any_whitespace (both engines' option)."""
    limits = limits or {}
    if engine == "vllm":
        from vllm import LLM, SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        options = {} if backend is None else {"structured_outputs_config": {"backend": backend}}
        llm = LLM(model_dir, load_format="dummy", max_model_len=4096, seed=0, **options, **limits)
    else:
        from minivllm import LLM, SamplingParams
        from minivllm.structured_output.params import StructuredOutputsParams

        llm = LLM(
            model_dir,
            load_format="dummy",
            max_model_len=4096,
            async_scheduling=not sync,
            **limits,
        )

    def params(max_tokens: int, constrained: bool, temperature: float = 0.6):
        so = None
        if constrained:
            so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=compact)
        return SamplingParams(
            temperature=temperature, ignore_eos=True, max_tokens=max_tokens, structured_outputs=so
        )

    return llm, params


def ttft(llm, params, constrained: bool) -> float:
    """Median of 5 one-token generates of new 1,000-token prompts (the grammar cached)."""
    times = []
    for i in range(6):
        prompt = [{"prompt_token_ids": [(7 * i + j) % 10000 for j in range(1000)]}]
        start = time.perf_counter()
        llm.generate(prompt, params(1, constrained, 0.0), use_tqdm=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def device_profile():
    """torch.profiler over the device's activity only (kernels, copies, graph replays)."""
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CUDA])


def device_time(trace, wall_s: float, top: int = 12) -> dict:
    """The device's busy time (the union of its kernels' and copies' intervals) against the
    wall time, and the names that took the most of it."""
    import torch

    intervals, by_name = [], {}
    for event in trace.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        intervals.append((event.time_range.start, event.time_range.end))
        name = event.name[:60]
        by_name[name] = by_name.get(name, 0.0) + event.device_time
    busy_us, end_us = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > end_us:
            busy_us += end - max(start, end_us)
            end_us = end
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return {
        "busy_s": round(busy_us / 1e6, 3),
        "wall_s": round(wall_s, 3),
        "idle_fraction": round(1 - busy_us / 1e6 / wall_s, 3),
        "top_s": {name: round(us / 1e6, 3) for name, us in ranked},
    }


def served_shape(num_prompts: int | None, input_len: int | None = None) -> Workload:
    n = num_prompts or SERVED_SHAPE["num_prompts"]
    prompts = random_prompts(n, input_len or SERVED_SHAPE["input_len"])
    return Workload("served_shape", prompts, [SERVED_SHAPE["output_len"]] * n, 4096)


def run(args: argparse.Namespace) -> None:
    limits = SERVED_LIMITS if args.served_shape else None
    llm, params = build(
        args.engine, args.model_dir, args.backend, args.sync, limits, args.disable_any_whitespace
    )
    constrained = not args.unconstrained
    llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}], params(8, False), use_tqdm=False)
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": [5, 6, 7]}], params(8, constrained), use_tqdm=False)
    first_compile = time.perf_counter() - start  # includes a short generate
    # The run's grammar is shared by its requests; shared, it gets llguidance lanes (built
    # in the background from its second request on): the steady state of a cached schema.
    llm.generate([{"prompt_token_ids": [8, 9, 10]}], params(8, constrained), use_tqdm=False)
    if args.served_shape:  # greedy, as the serving benchmark's clients ask
        workload, temperature = served_shape(args.num_requests, args.input_len), 0.0
    else:
        workload, temperature = make_workload("headline", args.num_requests), 0.6
    prompts = [{"prompt_token_ids": p} for p in workload.prompts]
    caps = [min(n, args.max_tokens or n) for n in workload.output_lens]
    all_params = [params(n, constrained, temperature) for n in caps]
    profile = cProfile.Profile() if args.profile else None
    phases = StepPhases() if args.phases else None
    if phases is not None:
        phases.install()
    gpu_profile = device_profile() if args.gpu_profile else contextlib.nullcontext()
    with gpu_profile as device_trace:
        start = time.perf_counter()
        if profile is not None:
            profile.enable()
        outputs = llm.generate(prompts, all_params, use_tqdm=False)
        seconds = time.perf_counter() - start
    if phases is not None:
        phases.uninstall()
    if profile is not None:
        profile.disable()
        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    valid = 0
    for o in outputs:
        try:
            json.loads(o.outputs[0].text)
            valid += 1
        except ValueError:
            pass
    result = {"engine": args.engine, "backend": args.backend, "constrained": constrained}
    result["disable_any_whitespace"] = args.disable_any_whitespace
    result["async_scheduling"] = args.engine == "vllm" or not args.sync
    result |= result_fields(workload, generated, seconds)
    result["valid_json"] = valid
    result["first_request_with_compile_ms"] = round(first_compile * 1e3, 2)
    if phases is not None:
        result["phases"] = phases.report()
    if device_trace is not None:
        result["gpu"] = device_time(device_trace, seconds)
    profile = cProfile.Profile() if args.profile else None
    if profile is not None:
        profile.enable()
    result["ttft_ms"] = round(ttft(llm, params, constrained) * 1e3, 2)
    if profile is not None:
        profile.disable()
        print("TTFT profile", file=sys.stderr)
        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    print(json.dumps(result), flush=True)
    if args.engine == "minivllm":
        llm.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("make").add_argument("out_dir")
    r = sub.add_parser("run")
    r.add_argument("engine", choices=["minivllm", "vllm"])
    r.add_argument("model_dir")
    r.add_argument("--backend", default=None, help="vLLM's structured-output backend")
    r.add_argument("--unconstrained", action="store_true")
    r.add_argument("--sync", action="store_true", help="minivllm without async scheduling")
    r.add_argument("--profile", action="store_true", help="the host's profile, on stderr")
    r.add_argument(
        "--phases", action="store_true", help="minivllm: host time per step phase (step_phases.py)"
    )
    r.add_argument(
        "--gpu-profile", action="store_true", help="the device busy time (torch.profiler)"
    )
    r.add_argument(
        "--served-shape", action="store_true", help="bench_serving.py's requests, server limits"
    )
    r.add_argument(
        "--disable-any-whitespace", action="store_true", help="compact JSON (vLLM's option)"
    )
    r.add_argument("--num-requests", type=int, default=None, help="default: the workload's")
    r.add_argument("--max-tokens", type=int, default=None, help="a cap on each output (smoke runs)")
    r.add_argument(
        "--input-len", type=int, default=None, help="--served-shape's prompt length (CPU runs)"
    )
    args = parser.parse_args()
    make(args.out_dir) if args.command == "make" else run(args)


if __name__ == "__main__":
    main()
