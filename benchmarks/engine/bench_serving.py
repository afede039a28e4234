"""Streaming serving vs offline on the same requests: output tok/s, TTFT, ITL. One JSON line.

Starts `minivllm serve` on a free loopback port, drives it with --max-concurrency streaming
clients (sse_client.py: the openai client's own CPU cost per chunk would cap the measured
rate), then runs the same prompts through LLM.generate.

python -m benchmarks.engine.bench_serving [--model DIR | --model-name qwen3-0.6b]
    [--num-prompts 512]
    [--max-concurrency 128] [--request-rate R] [--no-warm-up] [--input-len 1000]
    [--output-len 200] [--skip-offline] [--text-prompts] [--temperature T] [--port P] [--seed S]
    [--json-schema] [-- extra engine flags]

--request-rate: requests start at Poisson arrival times of R per second (as `vllm bench serve
--request-rate`), still at most --max-concurrency at once. --no-warm-up: the measured requests
are the server's first (a fresh server's first-round stalls show in TTFT p99; the server logs
every Triton compile after its own warm-up). --text-prompts: the prompts go as text (random
token ids decoded, as `vllm bench serve --dataset-name random` sends them), so that the
server's tokenization counts. --temperature: 0 (greedy) unless given; `vllm bench serve` sends
none, so its requests sample at the server's default, 1.0. --port: drive a server already
running there (no offline run unless --model is given and --skip-offline is not).
--json-schema: every request (served, warm-up and offline) under bench_structured.py's JSON
schema, sent as vLLM's `structured_outputs` field; output tok/s counts the tokens the server reports
(a grammar that ends stops its request early). The model needs a real tokenizer
(`bench_structured.py make DIR`). --seed: of the random prompts; a server that has served the
same prompts (an earlier run with the same seed) finds them in its prefix cache and skips
their prefill, so runs against one server take different seeds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request

from benchmarks.common import dummy_model_dir, percentile
from benchmarks.engine.bench_structured import SCHEMA
from benchmarks.sse_client import stream_completion
from benchmarks.workloads import MAX_TOKEN_ID, random_prompts

# Requests sent before the measured ones (at 8 at a time, 16 tokens each), unless --no-warm-up.
WARM_UP_PROMPTS = 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _one(
    port: int,
    model: str,
    prompt,
    output_len: int,
    temperature: float,
    sem,
    at: float,
    schema: dict | None = None,
) -> dict:
    await asyncio.sleep(at)
    async with sem:
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": output_len,
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        if schema is not None:  # vLLM's request field, which both servers take
            body["structured_outputs"] = {"json": schema}
        result = await stream_completion(port, body)
        times = result.text_times
        return {
            "ttft": times[0] - result.start,
            "itl": [b - a for a, b in zip(times, times[1:])],
            # A grammar that ends stops its request before max_tokens.
            "tokens": result.usage["completion_tokens"] if result.usage else output_len,
        }


async def _drive(
    port: int,
    model: str,
    prompts,
    output_len: int,
    concurrency: int,
    rate: float | None = None,
    temperature: float = 0.0,
    schema: dict | None = None,
) -> dict:
    sem = asyncio.Semaphore(concurrency)
    rng = random.Random(1)
    arrivals, t = [], 0.0
    for _ in prompts:
        arrivals.append(t)
        t += rng.expovariate(rate) if rate else 0.0
    start = time.perf_counter()
    results = await asyncio.gather(
        *(
            _one(port, model, p, output_len, temperature, sem, at, schema)
            for p, at in zip(prompts, arrivals)
        )
    )
    elapsed = time.perf_counter() - start
    ttfts = [r["ttft"] for r in results]
    itls = [x for r in results for x in r["itl"]]
    return {
        "output_tok_s": sum(r["tokens"] for r in results) / elapsed,
        "ttft_p50_ms": 1e3 * percentile(ttfts, 0.5),
        "ttft_p99_ms": 1e3 * percentile(ttfts, 0.99),
        "itl_p50_ms": 1e3 * percentile(itls, 0.5),
        "itl_p99_ms": 1e3 * percentile(itls, 0.99),
        "elapsed_s": elapsed,
        # (arrival s, TTFT ms) of the slowest first tokens: one stall shows as neighbours.
        "slowest_ttfts": sorted(
            ((round(at, 2), round(1e3 * r["ttft"], 1)) for at, r in zip(arrivals, results)),
            key=lambda x: -x[1],
        )[:8],
    }


def _serve(model: str, port: int, flags: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "minivllm", "serve", model, "--port", str(port)]
    cmd += ["--disable-log-requests", "--disable-uvicorn-access-log", *flags]
    proc = subprocess.Popen(cmd)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the server did not start")


def _offline(
    model: str, prompts, output_len: int, temperature: float, flags: dict, schema: dict | None
) -> float:
    from minivllm import LLM, SamplingParams
    from minivllm.structured_output import StructuredOutputsParams

    llm = LLM(model, **flags)
    params = SamplingParams(
        temperature=temperature,
        max_tokens=output_len,
        ignore_eos=True,
        structured_outputs=None if schema is None else StructuredOutputsParams(json=schema),
    )
    llm.generate([{"prompt_token_ids": p} for p in prompts[:8]], params, use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    llm.shutdown()
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def _engine_flags(extra: list[str]) -> dict:
    """--flag value pairs of the extra arguments as LLM options (ints where they parse)."""
    options, i = {}, 0
    while i < len(extra):
        name = extra[i].lstrip("-").replace("-", "_")
        value = extra[i + 1] if i + 1 < len(extra) else ""
        options[name] = int(value) if value.lstrip("-").isdigit() else value
        i += 2
    return options


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--model-name", default="qwen3-0.6b")
    parser.add_argument("--num-prompts", type=int, default=512)
    parser.add_argument("--max-concurrency", type=int, default=128)
    parser.add_argument("--request-rate", type=float, default=None)
    parser.add_argument("--no-warm-up", action="store_true")
    parser.add_argument("--input-len", type=int, default=1000)
    parser.add_argument("--output-len", type=int, default=200)
    parser.add_argument("--skip-offline", action="store_true")
    parser.add_argument("--text-prompts", action="store_true", help="text, not token ids")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--port", type=int, default=None, help="a server already running")
    parser.add_argument("--seed", type=int, default=0, help="of the random prompts")
    parser.add_argument(
        "--json-schema",
        action="store_true",
        help="every request under bench_structured.py's JSON schema (needs a real tokenizer)",
    )
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="engine flags, after --")
    args = parser.parse_args()
    extra = [a for a in args.extra if a != "--"]
    schema = SCHEMA if args.json_schema else None
    model = args.model or dummy_model_dir(args.model_name)
    has_weights = args.model is not None and (
        os.path.isfile(model)  # a .gguf file
        or any(name.endswith(".safetensors") for name in os.listdir(model))
    )
    if not has_weights and "--load-format" not in extra:  # a weightless directory (dummy)
        extra += ["--load-format", "dummy"]
    with open(os.path.join(model, "config.json")) as f:
        vocab_size = json.load(f)["vocab_size"]
    # The warm-up's prompts follow the measured ones: none of theirs is in the prefix cache
    # when the measured run starts.
    prompts = random_prompts(
        args.num_prompts + WARM_UP_PROMPTS,
        args.input_len,
        args.seed,
        high=min(vocab_size - 1, MAX_TOKEN_ID),
    )
    sent = prompts
    if args.text_prompts:  # as `vllm bench serve --dataset-name random` sends them
        from transformers import AutoTokenizer

        sent = AutoTokenizer.from_pretrained(model).batch_decode(prompts)
    warm_up_prompts, sent = sent[args.num_prompts :], sent[: args.num_prompts]
    prompts = prompts[: args.num_prompts]
    port = args.port or _free_port()
    proc = None if args.port else _serve(model, port, extra)
    try:
        warm_up_s = None
        if not args.no_warm_up:  # under the schema too: the measured run finds it compiled
            warm_up = asyncio.run(_drive(port, model, warm_up_prompts, 8, 16, schema=schema))
            warm_up_s = warm_up["elapsed_s"]
        served = asyncio.run(
            _drive(
                port,
                model,
                sent,
                args.output_len,
                args.max_concurrency,
                args.request_rate,
                args.temperature,
                schema,
            )
        )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    # Offline gets the same concurrency as the clients (no more seats than they fill).
    flags = {"max_num_seqs": args.max_concurrency, **_engine_flags(extra)}
    skip_offline = args.skip_offline or (args.port is not None and args.model is None)
    offline = (
        None
        if skip_offline
        else _offline(model, prompts, args.output_len, args.temperature, flags, schema)
    )
    result = {
        "bench": "serving",
        "model": model,
        "num_prompts": args.num_prompts,
        "max_concurrency": args.max_concurrency,
        "request_rate": args.request_rate,
        "warm_up": not args.no_warm_up,
        "warm_up_s": warm_up_s,  # a fresh server's first requests (and grammar) included
        "input_len": args.input_len,
        "output_len": args.output_len,
        "engine_flags": extra,
        "text_prompts": args.text_prompts,
        "temperature": args.temperature,
        "json_schema": args.json_schema,
        "served": served,
        "offline_output_tok_s": offline,
        "served_over_offline": None if offline is None else served["output_tok_s"] / offline,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
