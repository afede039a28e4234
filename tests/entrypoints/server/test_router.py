"""Two `minivllm serve` replicas (the session's server and one more, both with the API key)
behind vllm-router (skipped without it): plain and streamed requests pass through, both
replicas answer, /get_load answers, a client that goes away aborts its request on the replica."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.entrypoints.conftest import API_KEY, CPU_FLAGS, MODEL_NAME, Server, free_port

ROUTER = shutil.which("vllm-router") or shutil.which(
    "vllm-router", path=os.path.dirname(sys.executable)
)
needs_router = pytest.mark.skipif(ROUTER is None, reason="vllm-router is not installed")


def _get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    except OSError:
        return 0, ""
    finally:
        conn.close()


def _wait_ok(port: int, path: str, procs: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _get(port, path)[0] != 200:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError(f"127.0.0.1:{port}{path} never answered 200")
        time.sleep(0.2)


def _metric(port: int, name: str) -> float:
    _, text = _get(port, "/metrics")
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    )


class _Fleet:
    def __init__(self, model_dir: str, log_dir: str, first: Server) -> None:
        self.procs: list[subprocess.Popen] = []
        self.logs = []
        port = free_port()
        self.replica_ports = [first.port, port]
        cmd = [
            sys.executable, "-m", "minivllm", "serve", model_dir, "--port", str(port),
            "--served-model-name", MODEL_NAME, "other-name", *CPU_FLAGS, "--api-key", API_KEY,
            "--disable-uvicorn-access-log", "--timeout-graceful-shutdown", "2",
        ]  # fmt: skip
        self._start(cmd, f"{log_dir}/replica.log")
        _wait_ok(port, "/health", self.procs, 120)
        self.routers: dict[str, int] = {}
        for policy in ("round_robin", "cache_aware"):
            port, prometheus_port = free_port(), free_port()
            cmd = [
                ROUTER, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
                "--worker-urls", *[f"http://127.0.0.1:{p}" for p in self.replica_ports],
                "--prometheus-port", str(prometheus_port),
                "--worker-startup-check-interval", "1", "--log-level", "warning",
            ]  # fmt: skip
            self._start(cmd, f"{log_dir}/router-{policy}.log")
            _wait_ok(port, "/readiness", self.procs, 30)
            self.routers[policy] = port

    def _start(self, cmd: list[str], log_path: str) -> None:
        log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.logs.append(log)
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))

    def client(self, policy: str):
        import openai

        port = self.routers[policy]
        # The router passes the client's Authorization header on to the replicas.
        url = f"http://127.0.0.1:{port}/v1"
        return openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0)

    def finished(self) -> list[float]:
        """Requests each replica has finished (all reasons)."""
        return [_metric(p, "vllm:e2e_request_latency_seconds_count") for p in self.replica_ports]

    def stop(self) -> None:
        for proc in reversed(self.procs):  # routers first
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self.logs:
            log.close()


@pytest.fixture(scope="module")
def fleet(
    tiny_qwen3_dir: str, tmp_path_factory: pytest.TempPathFactory, server: Server
) -> Iterator[_Fleet]:
    fleet = _Fleet(tiny_qwen3_dir, str(tmp_path_factory.mktemp("router")), server)
    yield fleet
    fleet.stop()


def test_get_load_counts_open_requests_without_the_key(server) -> None:
    # vllm-router's power_of_two polls /get_load and sends no credentials.
    status, body = server.request("GET", "/get_load")
    assert status == 200 and body == {"load": 0}


@needs_router
@pytest.mark.parametrize("policy", ["round_robin", "cache_aware"])
def test_requests_pass_through_the_router(fleet: _Fleet, policy: str) -> None:
    client = fleet.client(policy)
    before = fleet.finished()
    messages = [{"role": "user", "content": "Hello through the router"}]
    chat = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=5)
    assert chat.choices[0].finish_reason in ("stop", "length") and chat.usage.completion_tokens
    completion = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=5)
    assert completion.choices[0].text is not None and completion.usage.prompt_tokens > 0
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=messages,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].usage.completion_tokens >= 1
    streamed = list(
        client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=5, stream=True)
    )
    assert streamed[-1].choices[0].finish_reason in ("stop", "length")
    assert {m.id for m in client.models.list().data} == {MODEL_NAME, "other-name"}
    after = fleet.finished()
    assert sum(after) - sum(before) == 4
    if policy == "round_robin":
        assert all(a > b for a, b in zip(after, before)), (before, after)


@needs_router
def test_router_reads_load_from_replicas(fleet: _Fleet) -> None:
    status, body = _get(fleet.routers["round_robin"], "/get_loads")
    assert status == 200
    loads = {w["worker"]: w["load"] for w in json.loads(body)["workers"]}
    assert loads == {f"http://127.0.0.1:{p}": 0 for p in fleet.replica_ports}


def _loads(fleet: _Fleet) -> list[int]:
    return [json.loads(_get(p, "/get_load")[1])["load"] for p in fleet.replica_ports]


@needs_router
@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_aborts_on_the_replica(fleet: _Fleet, stream: bool) -> None:
    port = fleet.routers["round_robin"]
    tokens_before = sum(_metric(p, "vllm:generation_tokens_total") for p in fleet.replica_ports)
    body = json.dumps(
        {"model": MODEL_NAME, "prompt": "Go on", "max_tokens": 400, "ignore_eos": True,
         "stream": stream}
    )  # fmt: skip
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {API_KEY}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
        )
        if stream:
            assert b"data: " in sock.recv(65536) or b"data: " in sock.recv(65536)
        else:
            deadline = time.monotonic() + 10
            while sum(_loads(fleet)) == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert sum(_loads(fleet)) == 1
    # The router drops its upstream connection; the replica aborts and frees the request.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        loads = _loads(fleet)
        if loads == [0, 0]:
            break
        time.sleep(0.1)
    assert loads == [0, 0]
    tokens = sum(_metric(p, "vllm:generation_tokens_total") for p in fleet.replica_ports)
    assert tokens - tokens_before < 400  # stopped before it would have finished
