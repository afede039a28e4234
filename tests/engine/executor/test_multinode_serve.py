"""`minivllm serve` across two "nodes" on loopback, launched as docs/serving.md says: the
server on node 0 (tensor-parallel rank 0 in its engine-core process) and `minivllm serve
--headless --node-rank 1` on node 1. A greedy completion equals TP=1's text; SIGTERM to the
server shuts both nodes down, each exiting 0 by itself."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import time

from minivllm import LLM, SamplingParams
from minivllm.engine.executor.tp_executor import free_port

FLAGS = ["--dtype", "float32", "--device", "cpu", "--block-size", "4"]
PROMPT = [5, 17, 42, 99, 3]


def node_flags(port: int) -> list[str]:
    return [
        "--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(port), *FLAGS,
    ]  # fmt: skip


def post(port: int, path: str, body: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def wait_healthy(proc: subprocess.Popen, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the server exited during start-up"
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.2)
    raise TimeoutError(f"the server was not healthy within {timeout} s")


def stop(proc: subprocess.Popen, timeout: float) -> int | None:
    """proc's exit code within timeout, or None (then it is killed)."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def test_serve_head_and_headless_node(tiny_qwen3_dir: str, tmp_path) -> None:
    rendezvous, http_port = free_port(), free_port()
    cli = [sys.executable, "-m", "minivllm", "serve", tiny_qwen3_dir]
    with open(tmp_path / "node1.log", "w") as log1, open(tmp_path / "head.log", "w") as log0:
        node1 = subprocess.Popen(
            [*cli, "--headless", "--node-rank", "1", *node_flags(rendezvous)],
            stdout=log1,
            stderr=subprocess.STDOUT,
        )
        head = subprocess.Popen(
            [*cli, "--port", str(http_port), *node_flags(rendezvous)],
            stdout=log0,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_healthy(head, http_port, timeout=120)
            body = {"model": tiny_qwen3_dir, "prompt": PROMPT, "max_tokens": 8}
            status, reply = post(http_port, "/v1/completions", {**body, "temperature": 0})
            assert status == 200, reply
            head.send_signal(signal.SIGTERM)
        finally:
            head_code = stop(head, timeout=30)
            node1_code = stop(node1, timeout=30)
    logs = (tmp_path / "head.log").read_text()[-2000:], (tmp_path / "node1.log").read_text()[-2000:]
    assert (head_code, node1_code) == (0, 0), logs
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=8)
        (expected,) = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)
    finally:
        llm.shutdown()
    assert reply["choices"][0]["text"] == expected.outputs[0].text
