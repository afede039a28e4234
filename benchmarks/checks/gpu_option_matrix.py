"""Runs every documented engine option combination briefly on the GPU; one JSON line each.

attention_backend x dtype x enforce_eager x async_scheduling x enable_prefix_caching, plus
deterministic mode per dtype, and tensor / data parallelism when two GPUs are there. A small
random model with head_dim 128 (the shape whose float32 prefill tiles used to overflow shared
memory) and ~600-token prompts, so that the prefill kernel takes its large tiles.

    python -m benchmarks.checks.gpu_option_matrix      # all combinations (~2-3 min on one H200)
    python -m benchmarks.checks.gpu_option_matrix --only triton,float32

"pass" means the engine started, generated every token asked for, served a second round
(prefix-cache hits where enabled) and a host-dependent request (penalties + logprobs), and
left every KV block free. "agree" is the fraction of greedy tokens equal to the first
combination of the same dtype (informational: schedules and kernels round differently).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import sys
import tempfile
import time
import traceback

BACKENDS = ("triton", "torch_sdpa")
DTYPES = ("bfloat16", "float16", "float32")
MAX_TOKENS = 16


def model_dir() -> str:
    from minivllm.tiny_model import build_tiny_model

    out = os.path.join(tempfile.gettempdir(), "minivllm-option-matrix-model")
    if not os.path.isfile(os.path.join(out, "model.safetensors")):
        build_tiny_model(
            out,
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=128,
            max_position_embeddings=2048,
        )
    return out


def combinations(num_gpus: int) -> list[dict]:
    combos = [
        dict(
            attention_backend=backend,
            dtype=dtype,
            enforce_eager=eager,
            async_scheduling=async_,
            enable_prefix_caching=prefix,
        )
        for backend, dtype, eager, async_, prefix in itertools.product(
            BACKENDS, DTYPES, (False, True), (True, False), (True, False)
        )
    ]
    combos += [dict(attention_backend="triton", dtype=d, deterministic=True) for d in DTYPES]
    if num_gpus >= 2:
        for dtype, eager, async_ in itertools.product(
            ("bfloat16", "float32"), *[(False, True)] * 2
        ):
            combos.append(
                dict(
                    dtype=dtype,
                    tensor_parallel_size=2,
                    enforce_eager=eager,
                    async_scheduling=async_,
                )
            )
        combos.append(dict(dtype="bfloat16", data_parallel_size=2))
    return combos


def workload() -> tuple[list[list[int]], list[int]]:
    import random

    rng = random.Random(0)
    prompts = [[rng.randint(3, 499) for _ in range(rng.randint(500, 700))] for _ in range(8)]
    # A short prompt sharing a long prefix: a prefix hit inside the first round too.
    prompts.append(prompts[0][:400] + [7, 8, 9])
    return prompts, [MAX_TOKENS] * len(prompts)


def run_combo(path: str, options: dict) -> dict:
    from minivllm import LLM, SamplingParams

    prompts, _ = workload()
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    host = SamplingParams(
        temperature=0.8, seed=1, max_tokens=8, presence_penalty=0.5, logprobs=2, ignore_eos=True
    )
    llm = LLM(path, gpu_memory_utilization=0.3, max_model_len=1024,
              max_cuda_graph_batch_size=16, **options)  # fmt: skip
    try:
        batch = [{"prompt_token_ids": p} for p in prompts]
        rounds = [llm.generate(batch, greedy, use_tqdm=False) for _ in range(2)]
        extra = llm.generate(batch[:3], host, use_tqdm=False)
        tokens = [o.outputs[0].token_ids for o in rounds[0]]
        ok = all(len(t) == MAX_TOKENS for r in rounds for o in r for t in [o.outputs[0].token_ids])
        ok = ok and all(len(o.outputs[0].token_ids) == 8 for o in extra)
        ok = ok and all(len(o.outputs[0].logprobs) == 8 for o in extra)
        engine = getattr(llm, "engine", None)
        scheduler = getattr(engine, "scheduler", None)
        blocks_free = None
        if scheduler is not None:
            bm = scheduler.block_manager
            blocks_free = bm.num_free_blocks == bm.num_blocks
            ok = ok and blocks_free
        return {
            "pass": bool(ok),
            "tokens": tokens,
            "rounds_equal": tokens == [o.outputs[0].token_ids for o in rounds[1]],
            "cached_tokens_round2": sum(o.num_cached_tokens for o in rounds[1]),
            "blocks_free": blocks_free,
        }
    finally:
        llm.shutdown()
        del llm
        gc.collect()
        import torch

        torch.cuda.empty_cache()


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    pairs = [(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return round(sum(x == y for x, y in pairs) / max(len(pairs), 1), 4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", type=int, default=0, help="first combination (restarts)")
    parser.add_argument("--only", default="", help="comma-separated values a combo must hold")
    parser.add_argument("--failed", type=int, default=0, help=argparse.SUPPRESS)  # restarts
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"error": "needs a CUDA GPU"}))
        return 1
    path = model_dir()
    combos = combinations(torch.cuda.device_count())
    wanted = [w for w in args.only.split(",") if w]
    references: dict[str, list[list[int]]] = {}
    num_failed = args.failed
    for index in range(args.start, len(combos)):
        options = combos[index]
        if wanted and not all(w in map(str, options.values()) for w in wanted):
            continue
        start = time.perf_counter()
        line = {"index": index, **options}
        try:
            result = run_combo(path, options)
            tokens = result.pop("tokens")
            reference = references.setdefault(options["dtype"], tokens)
            line.update(result, agree=agreement(tokens, reference))
        except Exception as e:  # reported as a failed combination, then the next one runs
            line.update({"pass": False, "error": f"{type(e).__name__}: {e}"[:300]})
            traceback.print_exc(file=sys.stderr)
        line["seconds"] = round(time.perf_counter() - start, 1)
        num_failed += not line["pass"]
        print(json.dumps(line), flush=True)
        if not line["pass"] and _cuda_is_broken():
            # A sticky CUDA error poisons this process: go on in a fresh one.
            argv = [a for a in sys.argv[1:] if not a.startswith(("--start", "--failed"))]
            restart = [f"--start={index + 1}", f"--failed={num_failed}"]
            os.execv(sys.executable, [sys.executable, "-m", __spec__.name, *argv, *restart])
    print(json.dumps({"summary": True, "combinations": len(combos), "failed": num_failed}))
    return 1 if num_failed else 0


def _cuda_is_broken() -> bool:
    import torch

    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return False
    except Exception:
        return True


if __name__ == "__main__":
    sys.exit(main())
