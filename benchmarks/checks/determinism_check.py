"""Does a request's output depend on its neighbours? Prints one JSON line
per mode (default, then deterministic) with, per variant, how many of the prompts got the same
greedy tokens as the reference batch and whether their logprobs are bitwise equal.

python -m benchmarks.checks.determinism_check [--modes default,deterministic] [--num-prompts 24]
    [--tensor-parallel-size 2]

Random-weight Qwen3-0.6B shape cut to 12 layers, embeddings x8 (peaky logits), bf16,
prompts of 20-700 tokens, 64 greedy tokens each.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import tempfile
import time

from benchmarks.common import make_dummy_model_dir


def random_model_dir(num_layers: int) -> str:
    """A saved random HF Qwen3 (0.6B shape, num_layers layers, embeddings x8), reused."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = os.path.join(tempfile.gettempdir(), f"minivllm-qwen3-{num_layers}l-random")
    if os.path.exists(os.path.join(out, "model.safetensors")):
        return out
    make_dummy_model_dir("qwen3-0.6b", out)
    path = os.path.join(out, "config.json")
    with open(path) as f:
        raw = json.load(f)
    raw["num_hidden_layers"] = num_layers
    raw.pop("layer_types", None)  # transformers 5 checks its length against the layer count
    with open(path, "w") as f:
        json.dump(raw, f)
    cfg = AutoConfig.from_pretrained(out)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(8.0)  # tied: sharpens the logits as well
    model.save_pretrained(out)
    return out


def make_prompts(num: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(2, 150000) for _ in range(rng.randint(20, 700))] for _ in range(num)]


def run(llm, prompts: list[list[int]], logprobs: bool, alone: bool = False) -> list[tuple]:
    """(token_ids, sampled-token logprobs or None) per prompt."""
    from minivllm import SamplingParams

    params = SamplingParams(
        temperature=0.0, max_tokens=64, ignore_eos=True, logprobs=0 if logprobs else None
    )
    groups = [[p] for p in prompts] if alone else [prompts]
    results = []
    for group in groups:
        outs = llm.generate([{"prompt_token_ids": p} for p in group], params, use_tqdm=False)
        for out in outs:
            c = out.outputs[0]
            lps = None
            if c.logprobs is not None:
                lps = [entry[t].logprob for t, entry in zip(c.token_ids, c.logprobs, strict=True)]
            results.append((c.token_ids, lps))
    return results


def compare(ref: list[tuple], got: list[tuple]) -> dict:
    same_tokens = sum(r[0] == g[0] for r, g in zip(ref, got, strict=True))
    result = {"identical": same_tokens, "of": len(ref)}
    if got[0][1] is not None:
        result["logprobs_bitwise_equal"] = sum(r[1] == g[1] for r, g in zip(ref, got, strict=True))
    return result


def engine(model_dir: str, deterministic: bool, tp: int, **options):
    from minivllm import LLM

    base = {
        "dtype": "bfloat16",
        "max_model_len": 1024,
        "max_num_seqs": 32,
        "max_cuda_graph_batch_size": 32,
        "gpu_memory_utilization": 0.4,
        "deterministic": deterministic,
        "tensor_parallel_size": tp,
    }
    return LLM(model_dir, **(base | options))


def free_memory() -> None:
    """Returns the dropped engine's GPU memory to the driver. The caller must hold no reference
    to the LLM any more (a `del llm` inside a helper leaves the caller's name alive, and the
    next engine's KV profiling then finds the old KV cache still in use)."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()


def check_mode(model_dir: str, prompts: list[list[int]], deterministic: bool, tp: int) -> dict:
    """The reference is the whole batch on a fresh engine; every variant is compared to it."""
    start = time.perf_counter()
    llm = engine(model_dir, deterministic, tp)
    ref = run(llm, prompts, logprobs=True)
    variants = {
        "warm_prefix_cache": compare(ref, run(llm, prompts, logprobs=True)),
        "each_alone": compare(ref, run(llm, prompts, logprobs=True, alone=True)),
        "tokens_only_async": compare(ref, run(llm, prompts, logprobs=False)),
    }
    llm.shutdown()
    del llm
    free_memory()
    for name, options in (
        ("max_num_batched_tokens_256", {"max_num_batched_tokens": 256}),
        ("preemption_64_blocks", {"num_gpu_blocks_override": 64}),
        ("sync_scheduling", {"async_scheduling": False}),
        ("eager_no_graphs", {"enforce_eager": True}),
    ):
        llm = engine(model_dir, deterministic, tp, **options)
        variants[name] = compare(ref, run(llm, prompts, logprobs=True))
        if name == "sync_scheduling":
            variants["sync_tokens_only"] = compare(ref, run(llm, prompts, logprobs=False))
        llm.shutdown()
        del llm
        free_memory()
    all_equal = all(
        v["identical"] == v["of"] and v.get("logprobs_bitwise_equal", v["of"]) == v["of"]
        for v in variants.values()
    )
    return {
        "bench": "determinism_check",
        "deterministic": deterministic,
        "tensor_parallel_size": tp,
        "all_bitwise_equal": all_equal,
        "variants": variants,
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="default,deterministic")
    parser.add_argument("--num-prompts", type=int, default=24)
    parser.add_argument("--num-layers", type=int, default=12)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    args = parser.parse_args()
    modes = args.modes.split(",")
    if not set(modes) <= {"default", "deterministic"}:
        raise SystemExit(f"--modes takes default and/or deterministic, got {args.modes!r}")
    model_dir = random_model_dir(args.num_layers)
    prompts = make_prompts(args.num_prompts)
    for mode in modes:
        deterministic = mode == "deterministic"
        result = check_mode(model_dir, prompts, deterministic, args.tensor_parallel_size)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
