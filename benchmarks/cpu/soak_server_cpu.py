"""Soak: `minivllm serve` on the tiny random model under streamed load with a share of clients
that hang up mid-stream, a greedy probe that must not change, and the server's memory sampled.
CPU, loopback. Prints one JSON line.

Usage: python -m benchmarks.cpu.soak_server_cpu [--seconds 600] [--clients 8] [--abort-share 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import openai

from minivllm.tiny_model import build_tiny_model

PROBE = {"prompt": "the quick brown fox", "max_tokens": 16, "temperature": 0}


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and its children (the engine core), in MB."""
    pids = [pid]
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    pids += [int(p) for p in out.split()]
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (FileNotFoundError, StopIteration):
            pass
    return total / 1024


async def client(api: openai.AsyncOpenAI, model: str, deadline: float, share: float, stats):
    rng = random.Random(random.SystemRandom().random())
    while time.monotonic() < deadline:
        words = [rng.choice(["a", "b", "fox", "dog"]) for _ in range(rng.randint(2, 40))]
        abort_after = rng.randint(1, 4) if rng.random() < share else None
        try:
            stream = await api.completions.create(
                model=model,
                prompt=" ".join(words),
                max_tokens=rng.randint(4, 48),
                temperature=rng.choice([0, 0.8]),
                stream=True,
            )
            chunks = 0
            async for _ in stream:
                chunks += 1
                if abort_after is not None and chunks >= abort_after:
                    await stream.close()  # the client hangs up mid-stream
                    stats["aborted"] += 1
                    break
            else:
                stats["completed"] += 1
        except openai.APIStatusError as e:
            stats["5xx" if e.status_code >= 500 else "4xx"] += 1
        except openai.APIConnectionError:
            stats["transport_errors"] += 1


def _probe_text(api_probe) -> str:
    return api_probe.choices[0].text


async def soak(port: int, model: str, pid: int, args) -> dict:
    stats = {"completed": 0, "aborted": 0, "4xx": 0, "5xx": 0, "transport_errors": 0}
    deadline = time.monotonic() + args.seconds
    api = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0)
    first = _probe_text(await api.completions.create(model=model, **PROBE))
    tasks = [
        asyncio.create_task(client(api, model, deadline, args.abort_share, stats))
        for _ in range(args.clients)
    ]
    rss, probes_same, probes = [tree_rss_mb(pid)], 0, 0
    while time.monotonic() < deadline:
        await asyncio.sleep(args.probe_every)
        probes += 1
        probes_same += _probe_text(await api.completions.create(model=model, **PROBE)) == first
        rss.append(tree_rss_mb(pid))
    await asyncio.gather(*tasks)
    await api.close()
    return {
        **stats,
        "probes": probes,
        "probes_identical": probes_same,
        "rss_mb_start": round(rss[0], 1),
        "rss_mb_end": round(rss[-1], 1),
        "rss_mb_max": round(max(rss), 1),
        "rss_mb_every_probe": [round(r) for r in rss],
        "health_after": _health(port),
    }


def _health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return response.status
    except OSError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--abort-share", type=float, default=0.2)
    parser.add_argument("--probe-every", type=float, default=10)
    parser.add_argument("--port", type=int, default=18931)
    args = parser.parse_args()
    model = build_tiny_model(tempfile.mkdtemp(prefix="soak-tiny-"))
    server = subprocess.Popen(
        [sys.executable, "-m", "minivllm", "serve", model, "--port", str(args.port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        for _ in range(240):
            if _health(args.port) == 200:
                break
            time.sleep(0.5)
        result = asyncio.run(soak(args.port, model, server.pid, args))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        rc = server.wait(timeout=60)
    print(json.dumps({"bench": "soak_server_cpu", **vars(args), **result, "server_rc": rc}))


if __name__ == "__main__":
    main()
