"""Server-process CPU per streamed token, on a fake engine core (no model, no GPU).

The fake core emits one token per open request every --step-ms, so the real HTTP server
(tokenizer, output processing, SSE, uvicorn) streams as fast as it can; light clients
(sse_client.py) read the streams. Prints one JSON line: output tok/s, server CPU
microseconds per token and per chunk (a chunk carries several tokens when the server lags),
and what the clients saw: time to first chunk and the gaps between chunks (a stalled event
loop shows there).

python -m benchmarks.cpu.bench_server_cpu [--num-prompts 512] [--max-concurrency 128]
    [--input-len 1000] [--output-len 200] [--step-ms 5] [--text-prompts] [--stream-interval N]
    [--profile FILE.prof | --sample]

--text-prompts: the prompts go as text (random token ids decoded, as `vllm bench serve
--dataset-name random` sends them), so that the server's tokenization counts; else as ids.

--sample: a sampling profiler (a thread reads the server's main-thread stack every ms, like
py-spy) prints the functions the event loop spends its time in, self and inclusive, to stderr.
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
import threading
import time

from benchmarks.common import dummy_model_dir, percentile
from benchmarks.sse_client import stream_completion
from benchmarks.workloads import random_prompts


class FakeCoreClient:
    """Stands in for EngineCoreClient: every step_s, one token for each open request."""

    step_s = 0.005

    def __init__(self, config, model_config, on_message, env=None) -> None:
        from minivllm.engine.stats import CoreInfo

        self.info = CoreInfo(
            max_model_len=4096, vocab_size=151936, num_blocks=1 << 20, block_size=16, pid=0
        )
        self._on_message = on_message
        self._remaining: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def add_requests(self, requests) -> None:
        with self._lock:
            for request in requests:  # EngineRequest
                self._remaining[request.req_id] = request.sampling_params.max_tokens

    def abort_requests(self, req_ids) -> None:
        with self._lock:
            for req_id in req_ids:
                self._remaining.pop(req_id, None)

    def shutdown(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        from minivllm.engine.client.protocol import MessageKind
        from minivllm.engine.stats import EngineStats
        from minivllm.engine.types import EngineOutput

        rng = random.Random(0)
        while not self._stop.wait(self.step_s):
            with self._lock:
                outputs = []
                for req_id, left in list(self._remaining.items()):
                    done = left == 1
                    reason = "length" if done else None
                    outputs.append(EngineOutput(req_id, [rng.randrange(10, 10000)], done, reason))
                    if done:
                        del self._remaining[req_id]
                    else:
                        self._remaining[req_id] = left - 1
            if outputs:
                self._on_message((MessageKind.OUTPUTS, outputs, EngineStats()))


class StackSampler:
    """Samples one thread's Python stack every interval_s; reports where the time goes."""

    def __init__(self, thread_id: int, interval_s: float = 0.001) -> None:
        self.thread_id, self.interval_s = thread_id, interval_s
        self.self_counts: dict[str, int] = {}
        self.total_counts: dict[str, int] = {}
        self.num_samples = 0
        self._stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            frame = sys._current_frames().get(self.thread_id)
            if frame is None:
                continue
            names = []
            while frame is not None:
                code = frame.f_code
                names.append(f"{os.path.basename(code.co_filename)}:{code.co_name}")
                frame = frame.f_back
            self.num_samples += 1
            self.self_counts[names[0]] = self.self_counts.get(names[0], 0) + 1
            for name in set(names):
                self.total_counts[name] = self.total_counts.get(name, 0) + 1

    def report(self, top: int = 40) -> str:
        self._stop.set()
        n = max(self.num_samples, 1)
        lines = [f"{self.num_samples} samples of the event loop thread"]
        for title, counts in (("self", self.self_counts), ("inclusive", self.total_counts)):
            lines.append(f"-- {title} %")
            for name, count in sorted(counts.items(), key=lambda kv: -kv[1])[:top]:
                lines.append(f"{100 * count / n:6.1f}  {name}")
        return "\n".join(lines)


def run_fake_server(
    model: str, port: int, step_ms: float, profile: str | None, stream_interval: int = 1
) -> None:
    """The server process: `minivllm serve` with the fake core patched in."""
    import minivllm.entrypoints.async_llm as async_llm
    from minivllm.entrypoints.cli import main as cli_main

    FakeCoreClient.step_s = step_ms / 1000
    async_llm.EngineCoreClient = FakeCoreClient
    argv = ["serve", model, "--port", str(port), "--disable-log-requests"]
    argv += ["--disable-uvicorn-access-log", "--load-format", "dummy"]
    argv += ["--stream-interval", str(stream_interval)]
    if profile == "sample":
        sampler = StackSampler(threading.get_ident())
        try:
            cli_main(argv)
        finally:
            print(sampler.report(), file=sys.stderr, flush=True)
        return
    if profile is None:
        cli_main(argv)
        return
    import cProfile

    cProfile.runctx("cli_main(argv)", globals(), {"cli_main": cli_main, "argv": argv}, profile)


async def _stream_one(port: int, body: dict, sem: asyncio.Semaphore):
    async with sem:
        result = await stream_completion(port, body)
    assert result.usage is not None
    return result


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_ready(port: int, proc: subprocess.Popen) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError("the server exited")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the server did not start")


def _bodies(args) -> list[dict]:
    """The requests: random prompts of --input-len token ids (or their text)."""
    prompts = random_prompts(args.num_prompts, args.input_len)
    if args.text_prompts:  # as `vllm bench serve --dataset-name random` sends them
        from transformers import AutoTokenizer

        prompts = AutoTokenizer.from_pretrained(args.model).batch_decode(prompts)
    return [
        {
            "model": args.model,
            "prompt": prompt,
            "max_tokens": args.output_len,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
        for prompt in prompts
    ]


async def _drive(port: int, bodies: list[dict], max_concurrency: int) -> list:
    """Every client's StreamResult."""
    sem = asyncio.Semaphore(max_concurrency)
    return await asyncio.gather(*(_stream_one(port, b, sem) for b in bodies))


def _percentile_ms(values: list[float], q: float) -> float:
    return round(1000 * percentile(values, q), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-prompts", type=int, default=512)
    parser.add_argument("--max-concurrency", type=int, default=128)
    parser.add_argument("--input-len", type=int, default=1000)
    parser.add_argument("--output-len", type=int, default=200)
    parser.add_argument("--step-ms", type=float, default=5.0)
    parser.add_argument("--text-prompts", action="store_true", help="text, not token ids")
    parser.add_argument("--profile", default=None, help="cProfile the server into this file")
    parser.add_argument("--sample", action="store_true", help="sampling profile to stderr")
    parser.add_argument("--stream-interval", type=int, default=1, help="the server's option")
    parser.add_argument("--serve-port", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    args.model = args.model or dummy_model_dir("qwen3-0.6b")
    if args.serve_port is not None:
        run_fake_server(
            args.model, args.serve_port, args.step_ms, args.profile, args.stream_interval
        )
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        __spec__.name,
        "--serve-port",
        str(port),
        "--step-ms",
        str(args.step_ms),
    ]
    cmd += ["--stream-interval", str(args.stream_interval)]
    profile = "sample" if args.sample else args.profile
    cmd += ["--model", args.model] + (["--profile", profile] if profile else [])
    proc = subprocess.Popen(cmd, stderr=None if args.sample else subprocess.DEVNULL)
    try:
        _wait_ready(port, proc)
        bodies = _bodies(args)
        cpu0, t0 = _cpu_seconds(proc.pid), time.perf_counter()
        results = asyncio.run(_drive(port, bodies, args.max_concurrency))
        cpu, wall = _cpu_seconds(proc.pid) - cpu0, time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(30)
    num_tokens = sum(r.usage["completion_tokens"] for r in results)
    num_chunks = sum(r.num_chunks - 1 for r in results)  # the usage chunk not counted
    ttfts = [r.text_times[0] - r.start for r in results]
    gaps = [b - a for r in results for a, b in zip(r.text_times, r.text_times[1:])]
    ideal = args.max_concurrency * 1000 / args.step_ms
    result = {
        "output_tok_per_s": round(num_tokens / wall),
        "fake_core_tok_per_s": round(ideal),
        "server_cpu_us_per_token": round(cpu / num_tokens * 1e6, 1),
        "server_cpu_us_per_chunk": round(cpu / num_chunks * 1e6, 1),
        "server_cpu_util": round(cpu / wall, 2),
        "wall_s": round(wall, 2),
        "ttft_p50_ms": _percentile_ms(ttfts, 0.5),
        "ttft_p99_ms": _percentile_ms(ttfts, 0.99),
        "chunk_gap_p99_ms": _percentile_ms(gaps, 0.99),
        "chunk_gap_max_ms": _percentile_ms(gaps, 1.0),
        "text_prompts": args.text_prompts,
        "stream_interval": args.stream_interval,
        "tokens": num_tokens,
        "chunks": num_chunks,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
