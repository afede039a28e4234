"""Offline throughput on dummy weights, one workload shape (benchmarks/workloads.py; default:
the headline of docs/performance.md). Prints one JSON line. It needs a CUDA GPU; --quick runs a
small workload on the built-in tiny model instead (a CPU smoke run, with a progress bar).

python -m benchmarks.engine.bench_throughput [--workload headline|short|long|prefix] [--num-seqs N]
    [--model-name qwen3-0.6b] [--enforce-eager] [--kv-cache-dtype fp8] [--quick]
    [--enable-return-routed-experts] ...
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

from benchmarks.common import (
    ModelBytes,
    dummy_model_dir,
    measure_bandwidth,
    model_bytes,
    require_cuda,
    roofline_seconds,
)
from benchmarks.workloads import WORKLOADS, Workload, make_workload, result_fields


class StepTimer:
    """Wraps EngineCore.step to split wall time into prefill-containing and decode-only steps."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.schedule = engine.scheduler.schedule
        self.step = engine.step
        self.last_decode_only = False
        self.times = {"decode": [], "mixed": []}
        engine.scheduler.schedule = self._schedule
        engine.step = self._step

    def _schedule(self):
        out = self.schedule()
        self.last_decode_only = out.num_decode_chunks == len(out.chunks)
        return out

    def _step(self):
        start = time.perf_counter()
        out = self.step()
        self.times["decode" if self.last_decode_only else "mixed"].append(
            time.perf_counter() - start
        )
        return out


def _step_times(timer: StepTimer) -> dict:
    decode, mixed = timer.times["decode"], timer.times["mixed"]
    return {
        "steps": len(decode) + len(mixed),
        "decode_steps": len(decode),
        "decode_s": round(sum(decode), 3),
        "mixed_steps": len(mixed),
        "mixed_s": round(sum(mixed), 3),
        "mean_decode_step_ms": round(1e3 * sum(decode) / max(1, len(decode)), 3),
    }


# --quick: requests, prompt lengths and output lengths small enough for a CPU (~a minute).
QUICK_NUM_SEQS = 16
QUICK_PROMPT_LENS = (16, 64)
QUICK_OUTPUT_LENS = (8, 32)


def quick_workload(vocab_size: int, num_requests: int | None, seed: int = 0) -> Workload:
    """A CPU-sized workload: QUICK_NUM_SEQS requests of short random prompts and outputs."""
    rng = random.Random(seed)
    count = num_requests or QUICK_NUM_SEQS
    prompts = [
        [rng.randint(10, vocab_size - 1) for _ in range(rng.randint(*QUICK_PROMPT_LENS))]
        for _ in range(count)
    ]
    output_lens = [rng.randint(*QUICK_OUTPUT_LENS) for _ in range(count)]
    return Workload("quick", prompts, output_lens, max_model_len=256)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-name", default="qwen3-0.6b")
    parser.add_argument(
        "--model", default=None, help="a model dir (default: dummy dir from --model-name)"
    )
    parser.add_argument("--workload", default="headline", choices=sorted(WORKLOADS))
    parser.add_argument("--num-seqs", type=int, default=None, help="requests (default: workload's)")
    parser.add_argument("--max-model-len", type=int, default=None, help="default: workload's")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="default: auto")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--no-async-scheduling", action="store_true")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--data-parallel-size", type=int, default=1)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: auto")
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--prefill-attention-kernel", default=None, help="auto|triton|gluon")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "fp8_e4m3"])
    parser.add_argument("--deterministic", action="store_true", help="batch-invariant numerics")
    parser.add_argument(
        "--custom-all-reduce", action="store_true", help="TP: symmetric-memory all-reduce (opt-in)"
    )
    parser.add_argument("--max-mixed-graph-tokens", type=int, default=None, help="0: eager")
    parser.add_argument(
        "--enable-return-routed-experts",
        action="store_true",
        help="MoE models: return every token's routed experts (what it costs)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a CPU-sized run: {QUICK_NUM_SEQS} short requests on the built-in tiny model "
        "(random weights), with a progress bar; without it a CUDA GPU is required",
    )
    args = parser.parse_args()

    if not args.quick:
        require_cuda(
            parser.prog,
            f"the {args.workload} workload on {args.model_name} would take hours on a CPU",
            "; --quick runs a small CPU-sized workload on the built-in tiny model",
        )

    from minivllm import LLM, SamplingParams
    from minivllm.tiny_model import default_tiny_model_dir

    if args.quick:
        model_dir = args.model or default_tiny_model_dir()
        workload = quick_workload(_read_config(model_dir)["vocab_size"], args.num_seqs)
        args.model_name = "tiny" if args.model is None else args.model_name
    else:
        model_dir = args.model or dummy_model_dir(args.model_name)
        workload = make_workload(args.workload, args.num_seqs)
    options = {
        "load_format": "auto" if args.quick else "dummy",
        "max_model_len": args.max_model_len or workload.max_model_len,
        "enforce_eager": args.enforce_eager,
        "tensor_parallel_size": args.tensor_parallel_size,
        "data_parallel_size": args.data_parallel_size,
        "async_scheduling": not args.no_async_scheduling,
        "deterministic": args.deterministic,
        "disable_custom_all_reduce": not args.custom_all_reduce,
        "enable_return_routed_experts": args.enable_return_routed_experts,
    }
    names = ("max_num_seqs", "max_num_batched_tokens", "block_size", "attention_backend",
             "prefill_attention_kernel", "max_mixed_graph_tokens")  # fmt: skip
    for name in (*names, "kv_cache_dtype"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    # The whole model's bytes, counted before the engine joins a tensor-parallel group.
    sizes = None if args.quick else model_bytes(_read_config(model_dir))
    llm = LLM(model_dir, **options)
    sampling = workload.sampling or [{}] * workload.num_requests
    params = [
        SamplingParams(ignore_eos=True, max_tokens=n, **({"temperature": 0.6} | options))
        for n, options in zip(workload.output_lens, sampling, strict=True)
    ]
    llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}], SamplingParams(max_tokens=8), use_tqdm=False)

    # Data-parallel replicas step in their own processes: no step timing there.
    timer = StepTimer(llm.engine) if args.data_parallel_size == 1 else None
    prompts = [{"prompt_token_ids": p} for p in workload.prompts]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=args.quick)
    seconds = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    result = {
        "bench": "throughput",
        "model": args.model_name,
        "enforce_eager": args.enforce_eager,
        "async_scheduling": not args.no_async_scheduling,
        "deterministic": args.deterministic,
        "routed_experts": args.enable_return_routed_experts,
        "kv_cache_dtype": args.kv_cache_dtype,
        "max_mixed_graph_tokens": llm.config.max_mixed_graph_tokens,
        "prefill_attention_kernel": llm.config.prefill_attention_kernel,
        "tp": args.tensor_parallel_size,
        "custom_all_reduce": args.custom_all_reduce,
        "dp": args.data_parallel_size,
        "max_model_len": options["max_model_len"],
        **_limits(llm),
        "num_seqs": workload.num_requests,
        **result_fields(workload, generated, seconds),
    }
    if timer is not None:
        result |= _step_times(timer)
    if sizes is not None:  # a GPU run (require_cuda)
        result |= _bound(sizes, workload, seconds)
    print(json.dumps(result), flush=True)
    llm.shutdown()


def _limits(llm) -> dict:
    """The scheduler limits the engine resolved (auto or explicit); a DP frontend has none."""
    limits = getattr(llm.engine, "limits", None)
    return {} if limits is None else limits._asdict()


def _read_config(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def _bound(sizes: ModelBytes, workload: Workload, seconds: float) -> dict:
    """Copy bandwidth, and the roofline bound of the headline (its all-start-together model
    does not describe the other shapes)."""
    bandwidth = measure_bandwidth()
    result = {"copy_tb_s": round(bandwidth / 1e12, 2)}
    if workload.name != "headline":
        return result
    prompt_lens = [len(p) for p in workload.prompts]
    bound_s = roofline_seconds(sizes, prompt_lens, workload.output_lens, bandwidth, 790e12)
    return result | {
        "bound_tok_s": round(workload.num_output_tokens / bound_s, 1),
        "fraction_of_bound": round(bound_s / seconds, 3),
    }


if __name__ == "__main__":
    main()
