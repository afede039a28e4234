"""Replicas behind vllm-router on loopback (CPU): prefix-cache hit rate and TTFT by policy.

Starts `--num-replicas` `minivllm serve` processes on a tiny random model (a KV cache too small
to hold every system prompt on one replica), then, for each `--policies` entry, a vllm-router
in front of them, and drives it with a shared-prefix chat workload (`--num-systems` system
prompts x `--users-per-system` users, shuffled, `--max-concurrency` streaming clients). Each
policy gets system prompts of its own, so the one before it leaves nothing it can hit (the
cache evicts least recently used blocks first). The figures come from the replicas' /metrics
(deltas over the run): prefix-cache hit rate (tokens found / tokens looked up) and mean TTFT
as the servers measure it, plus the clients' TTFT through the router. One JSON line.

    python -m benchmarks.cpu.bench_router_cpu [--policies cache_aware round_robin]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import percentile
from minivllm.engine.executor.tp_executor import free_port
from minivllm.tiny_model import build_tiny_model

_WORDS = (
    "cache router prefix token serve replica latency engine request stream batch kernel "
    "memory block queue policy worker scale model prompt answer system user chat fleet"
).split()


def _get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except OSError:
        return 0, ""


def _wait_ok(url: str, procs: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a process exited while waiting for {url}")
        if _get(url, 2.0)[0] == 200:
            return
        time.sleep(0.3)
    raise TimeoutError(f"{url} not ready in {timeout} s")


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _scrape(port: int) -> dict[str, float]:
    """minivllm:NAME (counter: _total, histogram: _sum/_count) -> value, labels summed."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(_get(f"http://127.0.0.1:{port}/metrics")[1]):
        for s in family.samples:
            if s.name.startswith("minivllm:") and not s.name.endswith("_created"):
                if "le" not in s.labels:
                    values[s.name] = values.get(s.name, 0.0) + s.value
    return values


def _workload(args, seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    systems = [
        f"You are assistant {seed}-{i}. " + " ".join(rng.choices(_WORDS, k=args.system_words))
        for i in range(args.num_systems)
    ]
    chats = [
        [
            {"role": "system", "content": system},
            {"role": "user", "content": f"user {u}: " + " ".join(rng.choices(_WORDS, k=8))},
        ]
        for system in systems
        for u in range(args.users_per_system)
    ]
    rng.shuffle(chats)
    return chats


async def _drive(port: int, chats: list[list[dict]], args) -> list[float]:
    """Streams every chat through the router, max_concurrency at a time; the clients' TTFTs."""
    import openai

    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120
    )
    queue = list(reversed(chats))
    ttfts: list[float] = []

    async def worker() -> None:
        while queue:
            messages = queue.pop()
            start = time.perf_counter()
            stream = await client.chat.completions.create(
                model="tiny",
                messages=messages,
                max_tokens=args.output_len,
                temperature=0,
                extra_body={"ignore_eos": True},
                stream=True,
            )
            first = None
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter()
            ttfts.append((first or time.perf_counter()) - start)

    await asyncio.gather(*(worker() for _ in range(args.max_concurrency)))
    await client.close()
    return ttfts


def _run_policy(policy: str, seed: int, replica_ports: list[int], args) -> dict:
    port, prom_port = free_port(), free_port()
    cmd = [
        args.router, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
        "--worker-urls", *[f"http://127.0.0.1:{p}" for p in replica_ports],
        "--prometheus-port", str(prom_port), "--worker-startup-check-interval", "1",
        "--log-level", "warning", *args.router_args.split(),
    ]  # fmt: skip
    router = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ok(f"http://127.0.0.1:{port}/readiness", [router], 60)
        asyncio.run(_drive(port, _workload(args, seed + 1000)[: args.max_concurrency], args))
        before = [_scrape(p) for p in replica_ports]
        start = time.perf_counter()
        client_ttfts = asyncio.run(_drive(port, _workload(args, seed), args))
        elapsed = time.perf_counter() - start
        after = [_scrape(p) for p in replica_ports]
        print(f"{policy}: {len(client_ttfts)} requests in {elapsed:.1f} s", file=sys.stderr)
    finally:
        _stop([router])

    def delta(name: str) -> list[float]:
        return [a.get(name, 0.0) - b.get(name, 0.0) for a, b in zip(after, before)]

    queries, hits = (
        delta("minivllm:prefix_cache_queries_total"),
        delta("minivllm:prefix_cache_hits_total"),
    )
    ttft_sum, ttft_count = (
        delta("minivllm:time_to_first_token_seconds_sum"),
        delta("minivllm:time_to_first_token_seconds_count"),
    )
    return {
        "prefix_cache_hit_rate": round(sum(hits) / max(sum(queries), 1), 4),
        "per_replica_hit_rate": [round(h / max(q, 1), 4) for h, q in zip(hits, queries)],
        "server_ttft_mean_ms": round(1e3 * sum(ttft_sum) / max(sum(ttft_count), 1), 2),
        "client_ttft_mean_ms": round(1e3 * sum(client_ttfts) / len(client_ttfts), 2),
        "client_ttft_p50_ms": round(1e3 * percentile(client_ttfts, 0.5), 2),
        "requests_per_replica": [int(c) for c in ttft_count],
        "elapsed_s": round(elapsed, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--policies", nargs="+", default=["cache_aware", "round_robin"])
    parser.add_argument("--num-replicas", type=int, default=2)
    parser.add_argument("--num-systems", type=int, default=8)
    parser.add_argument("--users-per-system", type=int, default=16)
    parser.add_argument("--system-words", type=int, default=50, help="~3.7 tokens a word")
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--max-concurrency", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, default=72, help="KV blocks per replica")
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--router", default=shutil.which("vllm-router") or "vllm-router")
    parser.add_argument(
        "--router-args", default="", help='more vllm-router flags, e.g. "--cache-threshold 0.5"'
    )
    args = parser.parse_args()

    model_dir = tempfile.mkdtemp(prefix="minivllm-router-bench-")
    build_tiny_model(model_dir, max_position_embeddings=args.max_model_len)
    ports = [free_port() for _ in range(args.num_replicas)]
    flags = [
        "--device", "cpu", "--dtype", "float32", "--served-model-name", "tiny",
        "--block-size", str(args.block_size), "--num-gpu-blocks-override", str(args.num_blocks),
        "--disable-log-requests", "--disable-uvicorn-access-log",
    ]  # fmt: skip
    replicas = [
        subprocess.Popen(
            [sys.executable, "-m", "minivllm", "serve", model_dir, "--port", str(p), *flags],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        for p in ports
    ]
    try:
        for p in ports:
            _wait_ok(f"http://127.0.0.1:{p}/health", replicas, 300)
        results = {
            policy: _run_policy(policy, args.seed + i, ports, args)
            for i, policy in enumerate(args.policies)
        }
    finally:
        _stop(replicas)
        shutil.rmtree(model_dir, ignore_errors=True)
    config = {k: v for k, v in vars(args).items() if k != "router"}
    print(json.dumps({"bench": "router_cpu", **config, "results": results}))


if __name__ == "__main__":
    main()
