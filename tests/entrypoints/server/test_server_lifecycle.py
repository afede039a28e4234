"""Faults and shutdown: a dead core fails in-flight requests and /health (kept up by
MINIVLLM_KEEP_ALIVE_ON_ENGINE_DEATH; without it the server exits 1, test_server_engine_health.py);
SIGTERM exits 0."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time

from tests.entrypoints.conftest import MODEL_NAME, Server, alive

LONG = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 400, "ignore_eos": True}
KEEP_ALIVE = {"MINIVLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}


def _stream_lines(port: int, body: dict, headers: dict, started: threading.Event) -> list[str]:
    """Reads an SSE response to its end; sets `started` once the first chunk is in."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}), headers)
    response = conn.getresponse()
    assert response.status == 200
    lines = []
    for raw in response:
        line = raw.decode().strip()
        if line:
            lines.append(line)
            started.set()
    conn.close()
    return lines


def _run_in_thread(fn, *args) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(fn(*args)), daemon=True)
    thread.start()
    return thread, result


def test_killed_core_fails_requests_then_sigterm_exits_clean(tiny_qwen3_dir, tmp_path) -> None:
    server = Server(tiny_qwen3_dir, str(tmp_path / "server.log"), env=KEEP_ALIVE)
    try:
        started = threading.Event()
        headers = {"Content-Type": "application/json"}
        stream_thread, lines = _run_in_thread(_stream_lines, server.port, LONG, headers, started)
        plain_thread, plain = _run_in_thread(server.request, "POST", "/v1/completions", LONG)
        assert started.wait(30)
        os.kill(server.core_pid, signal.SIGKILL)
        stream_thread.join(20)
        plain_thread.join(20)
        assert not stream_thread.is_alive() and not plain_thread.is_alive()  # nothing hangs
        error = json.loads(lines[0][-2][len("data: ") :])["error"]
        assert error["code"] == 503 and lines[0][-1] == "data: [DONE]"
        status, body = plain[0]
        assert status == 503 and "dead" in body["error"]["message"]
        assert server.request("GET", "/health")[0] == 503
        assert server.request("POST", "/v1/completions", LONG, headers)[0] == 503
    finally:
        code = server.stop(signal.SIGTERM)
    assert code == 0


def test_fault_in_step_and_env_api_key(tiny_qwen3_dir, tmp_path) -> None:
    env = {"MINIVLLM_FAULT_AT_STEP": "4", "MINIVLLM_API_KEY": "env-key", **KEEP_ALIVE}
    server = Server(tiny_qwen3_dir, str(tmp_path / "server.log"), env=env)
    try:
        headers = {"Authorization": "Bearer env-key", "Content-Type": "application/json"}
        assert server.request("POST", "/v1/completions", LONG)[0] == 401
        started = threading.Event()
        lines = _stream_lines(server.port, LONG, headers, started)
        assert "injected fault" in json.loads(lines[-2][len("data: ") :])["error"]["message"]
        assert server.request("GET", "/health")[0] == 503
        assert "injected fault" in server.logs()
    finally:
        assert server.stop() == 0
    assert not alive(server.core_pid)


def test_sigterm_finishes_open_request_and_leaves_no_orphan(tiny_qwen3_dir, tmp_path) -> None:
    server = Server(tiny_qwen3_dir, str(tmp_path / "server.log"))
    core_pid = server.core_pid
    body = {**LONG, "max_tokens": 30}
    started = threading.Event()
    thread, lines = _run_in_thread(
        _stream_lines, server.port, body, {"Content-Type": "application/json"}, started
    )
    assert started.wait(30)
    start = time.time()
    code = server.stop(signal.SIGTERM)
    thread.join(10)
    assert code == 0 and time.time() - start < 15
    assert lines and lines[0][-1] == "data: [DONE]"
    finish = json.loads(lines[0][-2][len("data: ") :])["choices"][0]["finish_reason"]
    assert finish == "length"  # graceful: the open request finished
    assert not alive(core_pid)
    # A clean exit prints nothing after the server's last line (no nanobind leak warnings).
    assert "leaked" not in (tmp_path / "server.log").read_text()


def test_core_exits_when_the_server_is_killed(tiny_qwen3_dir, tmp_path) -> None:
    server = Server(tiny_qwen3_dir, str(tmp_path / "server.log"))
    core_pid = server.core_pid
    assert alive(core_pid)
    server.stop(signal.SIGKILL)  # no chance to clean up: the core sees EOF on its socket
    deadline = time.time() + 10
    while alive(core_pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(core_pid)
