"""One workload of benchmarks/workloads.py, or batch-1 latency, through either engine's
vLLM-style API, for side-by-side runs on dummy weights. Prints one JSON line (a workload: the
same fields as bench_throughput.py; latency: bench_latency.py's ttft_ms, its quartiles and
tpot_ms).

Usage: [TP=N] [GPU_UTIL=0.9] [KV_CACHE_DTYPE=fp8] [DETERMINISTIC=1] [SPEC='{"method": ...}']
       [PREFILL_KERNEL=auto|triton|gluon] [SAMPLING='{"repetition_penalty": 1.05}']
       [ENGINE_OPTIONS='{"enable_prefix_caching": true}']
       python -m benchmarks.peer.peer_workload_bench ENGINE MODEL_DIR WORKLOAD[,WORKLOAD...]
            [NUM_REQUESTS]
            ENGINE: minivllm | vllm; WORKLOAD: one of workloads.WORKLOADS, latency (batch 1,
            greedy) or latency-penalty (the same with a repetition penalty of 1.05); several,
            comma-separated, run on one engine, a JSON line each (each later workload's
            prompt ids shifted: workloads.shifted)
Needs only benchmarks/workloads.py (run from the repository's root); both engines return token
ids only (detokenize=False: no text, no logprob texts; vLLM also skips its tokenizer), and vLLM
keeps its defaults except what the workload needs (max_model_len, temperature 0.6, ignore_eos)
and, for a vision-language config (Qwen3.5's), language_model_only: the text path minivllm
runs, and for Gated DeltaNet layers gdn_prefill_backend "triton" (its Hopper default needs
flashinfer, which the peer kit does not ship).
DETERMINISTIC=1 turns on minivllm's deterministic mode; vLLM's counterpart is its own
environment variable, VLLM_BATCH_INVARIANT=1. SPEC: a speculative_config (JSON) for either
engine. PREFILL_KERNEL: minivllm's prefill_attention_kernel. SAMPLING: SamplingParams options
(JSON) for every request, on top of the workload's own (latency: on top of greedy).
ENGINE_OPTIONS: more LLM(...) options (JSON) for the engine.
"""

from __future__ import annotations

import json
import os
import sys
import time

from benchmarks.workloads import (
    WORKLOADS,
    Workload,
    make_workload,
    measure_batch1,
    result_fields,
    shifted,
)

ENGINES = ("minivllm", "vllm")


def build(engine: str, model_dir: str, max_model_len: int):
    """(llm, SamplingParams factory (max_tokens, **options) -> params) for the engine; options
    default to temperature 0.6, SAMPLING's options on top."""
    common = {"max_model_len": max_model_len}
    common["tensor_parallel_size"] = int(os.environ.get("TP", "1"))
    if os.environ.get("KV_CACHE_DTYPE"):
        common["kv_cache_dtype"] = os.environ["KV_CACHE_DTYPE"]
    if os.environ.get("SPEC"):
        common["speculative_config"] = json.loads(os.environ["SPEC"])
    common |= json.loads(os.environ.get("ENGINE_OPTIONS") or "{}")
    if engine == "vllm":
        from vllm import LLM, SamplingParams

        if _is_vision_language(model_dir):  # the text path alone, as minivllm runs it
            common.setdefault("language_model_only", True)
        if _has_linear_attention(model_dir):  # the peer kit ships no flashinfer, its default
            common.setdefault("gdn_prefill_backend", "triton")  # prefill on Hopper
        llm = LLM(
            model=model_dir,
            load_format="dummy",
            skip_tokenizer_init=True,
            gpu_memory_utilization=float(os.environ.get("GPU_UTIL", "0.9")),
            seed=0,
            **common,
        )
        return llm, lambda n, **options: SamplingParams(
            ignore_eos=True, max_tokens=n, detokenize=False, **_options(options)
        )
    from minivllm import LLM, SamplingParams

    deterministic = os.environ.get("DETERMINISTIC") == "1"
    common["prefill_attention_kernel"] = os.environ.get("PREFILL_KERNEL", "auto")
    llm = LLM(model_dir, load_format="dummy", deterministic=deterministic, **common)
    return llm, lambda n, **options: SamplingParams(
        ignore_eos=True, max_tokens=n, detokenize=False, **_options(options)
    )


def _is_vision_language(model_dir: str) -> bool:
    """Whether model_dir's config is a vision-language model's (a text_config inside)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        return "text_config" in json.load(f)


def _has_linear_attention(model_dir: str) -> bool:
    """Whether model_dir's config has Gated DeltaNet layers (Qwen3.5's, Qwen3-Next's)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    return "linear_attention" in config.get("text_config", config).get("layer_types", [])


def _options(options: dict) -> dict:
    """The request's sampling options: temperature 0.6 unless given, SAMPLING's on top."""
    return {"temperature": 0.6} | options | json.loads(os.environ.get("SAMPLING") or "{}")


def scheduler_limits(engine: str, llm) -> dict:
    """max_num_seqs and max_num_batched_tokens as the engine resolved them."""
    if engine == "minivllm":
        setup = getattr(llm.engine, "setup", None)  # a data-parallel frontend has none
        limits = None if setup is None else setup.limits
        return {} if limits is None else limits._asdict()
    try:
        sched = llm.llm_engine.vllm_config.scheduler_config
    except AttributeError:  # another vLLM version: the figures still print
        return {}
    return {
        "max_num_seqs": sched.max_num_seqs,
        "max_num_batched_tokens": sched.max_num_batched_tokens,
    }


def throughput(llm, params, workload: Workload) -> dict:
    """One generate of the whole workload, timed."""
    prompts = [{"prompt_token_ids": p} for p in workload.prompts]
    start = time.perf_counter()
    sampling = workload.sampling or [{}] * workload.num_requests
    requests = [params(n, **o) for n, o in zip(workload.output_lens, sampling, strict=True)]
    outputs = llm.generate(prompts, requests, use_tqdm=False)
    seconds = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    return result_fields(workload, generated, seconds)


# Batch-1 latency, greedy, with these options on top.
LATENCY_OPTIONS = {"latency": {}, "latency-penalty": {"repetition_penalty": 1.05}}


def latency(llm, params, options: dict) -> dict:
    """Batch 1, as bench_latency.py measures it (workloads.measure_batch1)."""

    def generate(prompt: list[int], max_tokens: int) -> None:
        request = params(max_tokens, temperature=0.0, **options)
        llm.generate([{"prompt_token_ids": prompt}], request, use_tqdm=False)

    return measure_batch1(generate).fields()


def make_workloads(names: list[str], num_requests: int | None) -> dict[str, Workload]:
    """The named throughput workloads (latency names skipped), each one's ids shifted by its
    place in the list: none finds an earlier one's prompts in the prefix cache (the first keeps
    its ids)."""
    return {
        n: shifted(make_workload(n, num_requests), i) for i, n in enumerate(names) if n in WORKLOADS
    }


def main(argv: list[str]) -> int:
    names = argv[2].split(",") if len(argv) >= 3 else []
    known = (*WORKLOADS, *LATENCY_OPTIONS)
    if len(argv) not in (3, 4) or argv[0] not in ENGINES or not set(names) <= set(known):
        print(__doc__, file=sys.stderr)
        return 2
    engine, model_dir = argv[:2]
    num_requests = int(argv[3]) if len(argv) == 4 else None
    workloads = make_workloads(names, num_requests)
    max_model_len = max([w.max_model_len for w in workloads.values()], default=4096)
    llm, params = build(engine, model_dir, max_model_len)
    llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}], params(8), use_tqdm=False)  # warm-up
    result = {"engine": engine, "tp": int(os.environ.get("TP", "1"))}
    result["kv_cache_dtype"] = os.environ.get("KV_CACHE_DTYPE") or "auto"
    result["spec"] = os.environ.get("SPEC") or None
    result["sampling"] = os.environ.get("SAMPLING") or None
    if engine == "minivllm":
        result["prefill_kernel"] = os.environ.get("PREFILL_KERNEL", "auto")
    result["deterministic"] = (
        os.environ.get("DETERMINISTIC" if engine == "minivllm" else "VLLM_BATCH_INVARIANT") == "1"
    )
    result |= scheduler_limits(engine, llm)
    for name in names:
        if name in workloads:
            fields = throughput(llm, params, workloads[name])
        else:
            fields = {"workload": name} | latency(llm, params, LATENCY_OPTIONS[name])
        print(json.dumps(result | fields), flush=True)
    if engine == "minivllm":
        llm.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
