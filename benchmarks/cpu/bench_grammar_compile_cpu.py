"""What a new JSON schema costs a server: `minivllm serve` (the tiny model on the CPU, or
--model) gets --num-schemas requests, each with a schema it has not seen (--num-properties
required properties), then one of them again. Prints one JSON line: each process's CPU
seconds per new schema (the frontend's and the engine core's, from /proc), the requests'
median latency, and the repeated schema's latency (a cache hit).

python -m benchmarks.cpu.bench_grammar_compile_cpu [--num-schemas 5] [--num-properties 3000]
    [--model DIR]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SERVER_FLAGS = (
    "--device", "cpu", "--dtype", "float32", "--block-size", "4",
    "--num-gpu-blocks-override", "512", "--served-model-name", "m",
    "--disable-uvicorn-access-log",
)  # fmt: skip


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pid(pid: int) -> int:
    """The engine core: the server's one child process."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        return int(entry)
            except OSError:
                continue
    raise RuntimeError(f"process {pid} has no child")


def post(port: int, body: dict) -> tuple[int, float]:
    """(status, seconds) of one POST /v1/completions."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    start = time.perf_counter()
    connection.request(
        "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    response.read()
    return response.status, time.perf_counter() - start


def schema(index: int, num_properties: int) -> dict:
    names = [f"s{index}_field_{j}" for j in range(num_properties)]
    return {
        "type": "object",
        "properties": {name: {"type": "integer"} for name in names},
        "required": names,
        "additionalProperties": False,
    }


def start_server(model: str) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "minivllm", "serve", model, "--port", str(port), *SERVER_FLAGS]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return server, port
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("the server did not become healthy in 300 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-schemas", type=int, default=5)
    parser.add_argument("--num-properties", type=int, default=3000)
    parser.add_argument("--model", default=None, help="a model directory (default: the tiny model)")
    args = parser.parse_args()
    model = args.model
    if model is None:
        from minivllm.tiny_model import build_tiny_model

        model = build_tiny_model(tempfile.mkdtemp(prefix="minivllm-tiny-"), "Qwen3ForCausalLM")
    server, port = start_server(model)
    try:
        pids = {"frontend": server.pid, "core": child_pid(server.pid)}
        post(
            port,
            {"model": "m", "prompt": "warm", "max_tokens": 1, "structured_outputs": {"regex": "a"}},
        )
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        bodies = [
            {
                "model": "m",
                "prompt": "x",
                "max_tokens": 1,
                "structured_outputs": {"json": schema(i, args.num_properties)},
            }
            for i in range(args.num_schemas)
        ]
        results = [post(port, body) for body in bodies]
        after = {name: cpu_seconds(pid) for name, pid in pids.items()}
        status, cached_s = post(port, bodies[0])
    finally:
        server.terminate()
        server.wait(30)
    per_schema = {name: (after[name] - before[name]) / args.num_schemas for name in pids}
    print(
        json.dumps(
            {
                "num_schemas": args.num_schemas,
                "num_properties": args.num_properties,
                "statuses": sorted({s for s, _ in results} | {status}),
                "frontend_cpu_s_per_schema": round(per_schema["frontend"], 3),
                "core_cpu_s_per_schema": round(per_schema["core"], 3),
                "total_cpu_s_per_schema": round(sum(per_schema.values()), 3),
                "latency_s_median": round(statistics.median(s for _, s in results), 3),
                "cached_latency_ms": round(cached_s * 1000, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
