"""A dead or wedged engine core: the client reaps it, /health sees a stall, a dead core makes
the server fail its open requests cleanly and exit non-zero (docs/serving.md, "Faults")."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

from minivllm.config import EngineConfig
from minivllm.engine.client.core_client import EngineCoreClient
from minivllm.engine.client.protocol import MessageKind
from minivllm.engine.types import EngineRequest
from minivllm.models.model_config import ModelConfig
from minivllm.sampling_params import SamplingParams
from tests.entrypoints.conftest import MODEL_NAME, Server
from tests.entrypoints.server.test_server_lifecycle import LONG, _run_in_thread, _stream_lines

HEADERS = {"Content-Type": "application/json"}


def _exists(pid: int) -> bool:
    """The pid is still in the process table (a zombie counts: nobody reaped it)."""
    return os.path.exists(f"/proc/{pid}")


def _wait_until(predicate, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_client_reaps_a_core_whose_step_failed(tiny_qwen3_dir) -> None:
    config = EngineConfig(
        tiny_qwen3_dir, device="cpu", dtype="float32", block_size=4, num_gpu_blocks_override=64
    )
    messages: list[tuple] = []
    dead = threading.Event()

    def on_message(msg: tuple) -> None:
        messages.append(msg)
        if msg[0] is MessageKind.DEAD:
            dead.set()

    env = {**os.environ, "MINIVLLM_FAULT_AT_STEP": "2"}
    client = EngineCoreClient(config, ModelConfig.from_hf(tiny_qwen3_dir), on_message, env=env)
    try:
        pid = client.info.pid
        params = SamplingParams(max_tokens=20, ignore_eos=True)
        client.add_requests([EngineRequest("r0", [1, 2, 3], params, time.time())])
        assert dead.wait(30)
        assert "injected fault" in messages[-1][1]
        assert _wait_until(lambda: not _exists(pid), 10), "the core was left a zombie"
        assert [m[0] for m in messages].count(MessageKind.DEAD) == 1
    finally:
        client.shutdown()


def test_health_is_503_while_the_core_is_stopped_with_work_queued(tiny_qwen3_dir, tmp_path):
    env = {"MINIVLLM_ENGINE_ITERATION_TIMEOUT_S": "1"}
    server = Server(tiny_qwen3_dir, str(tmp_path / "server.log"), env=env)
    try:
        os.kill(server.core_pid, signal.SIGSTOP)
        time.sleep(1.5)
        assert server.request("GET", "/health")[0] == 200  # stopped but idle: nothing waits
        os.kill(server.core_pid, signal.SIGCONT)
        started = threading.Event()
        body = {**LONG, "max_tokens": 200}
        thread, lines = _run_in_thread(_stream_lines, server.port, body, HEADERS, started)
        assert started.wait(30)
        os.kill(server.core_pid, signal.SIGSTOP)
        try:
            assert _wait_until(lambda: server.request("GET", "/health")[0] == 503, 10)
            status, body_503 = server.request("GET", "/health")
            assert status == 503 and "stalled" in body_503["error"]["message"]
        finally:
            os.kill(server.core_pid, signal.SIGCONT)
        assert _wait_until(lambda: server.request("GET", "/health")[0] == 200, 10)
        thread.join(60)
        finish = json.loads(lines[0][-2][len("data: ") :])["choices"][0]["finish_reason"]
        assert finish == "length" and lines[0][-1] == "data: [DONE]"  # it resumed
    finally:
        assert server.stop() == 0


def test_a_dead_core_fails_open_requests_then_the_server_exits_1(tiny_qwen3_dir, tmp_path):
    server = Server(tiny_qwen3_dir, str(tmp_path / "server.log"))
    try:
        started = threading.Event()
        stream_thread, lines = _run_in_thread(_stream_lines, server.port, LONG, HEADERS, started)
        plain_thread, plain = _run_in_thread(server.request, "POST", "/v1/completions", LONG)
        assert started.wait(30)
        time.sleep(0.3)  # the plain request is in too
        os.kill(server.core_pid, signal.SIGKILL)
        stream_thread.join(20)
        plain_thread.join(20)
        error = json.loads(lines[0][-2][len("data: ") :])["error"]
        assert error["code"] == 503 and lines[0][-1] == "data: [DONE]"
        status, body = plain[0]
        assert status == 503 and "dead" in body["error"]["message"]
        # Nobody signals it: the server exits by itself, non-zero, for a supervisor to see.
        code = server.proc.wait(30)
    finally:
        server.stop(signal.SIGKILL)
    assert code == 1
    with open(server.log.name) as f:
        assert "exiting 1" in f.read()


def test_a_step_failure_exits_1_and_keep_alive_keeps_the_server_up(tiny_qwen3_dir, tmp_path):
    env = {"MINIVLLM_FAULT_AT_STEP": "3"}
    server = Server(tiny_qwen3_dir, str(tmp_path / "exits.log"), env=env)
    try:
        status, body = server.request("POST", "/v1/completions", LONG, HEADERS)
        assert status == 503 and "injected fault" in body["error"]["message"]
        code = server.proc.wait(30)
    finally:
        server.stop(signal.SIGKILL)
    assert code == 1
    env["MINIVLLM_KEEP_ALIVE_ON_ENGINE_DEATH"] = "1"
    server = Server(tiny_qwen3_dir, str(tmp_path / "keep.log"), env=env)
    try:
        assert server.request("POST", "/v1/completions", LONG, HEADERS)[0] == 503
        time.sleep(0.5)
        assert server.proc.poll() is None
        assert server.request("GET", "/health")[0] == 503
        short = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2}
        assert server.request("POST", "/v1/completions", short, HEADERS)[0] == 503
    finally:
        assert server.stop() == 0
