"""Slow clients and shutdown: a request's head and body have deadlines, the limits follow
their flags, and requests still open past the graceful-shutdown time are failed cleanly."""

from __future__ import annotations

import http.client
import json
import select
import signal
import socket
import threading
import time

import pytest

from tests.entrypoints.conftest import MODEL_NAME, Server, read_response

COMPLETION = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2}


@pytest.fixture(scope="module")
def strict_server(tiny_qwen3_dir, tmp_path_factory):
    """A server with small limits: 1 s to send a head or a body, 4 KiB bodies, 8 prompts."""
    log = str(tmp_path_factory.mktemp("strict") / "server.log")
    flags = ("--timeout-request-read", "1", "--max-request-body-bytes", "4096")
    srv = Server(tiny_qwen3_dir, log, *flags, "--max-prompts-per-request", "8")
    yield srv
    srv.stop()


def _trickle(sock: socket.socket, data: bytes, every_s: float) -> str:
    """Sends data a byte every every_s until the server answers; returns the answer."""
    for byte in data:
        sock.sendall(bytes([byte]))
        if select.select([sock], [], [], every_s)[0]:
            return read_response(sock)
    return ""


HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def test_slow_head_and_slow_body_are_cut(strict_server) -> None:
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", strict_server.port), timeout=10) as sock:
        answer = _trickle(sock, HEAD, 0.2)
    assert answer.startswith("HTTP/1.1 408") and time.perf_counter() - start < 4, answer
    body = json.dumps(COMPLETION).encode()
    with socket.create_connection(("127.0.0.1", strict_server.port), timeout=10) as sock:
        sock.sendall(HEAD + f"Content-Length: {len(body)}\r\n\r\n".encode())
        start = time.perf_counter()
        answer = _trickle(sock, body, 0.2)
    assert answer.startswith("HTTP/1.1 408") and "did not arrive within 1 s" in answer, answer
    assert time.perf_counter() - start < 4


def test_limits_follow_the_flags(strict_server) -> None:
    body = {**COMPLETION, "prompt": "x" * 5000}
    status, response = strict_server.request("POST", "/v1/completions", body)
    assert status == 413 and "--max-request-body-bytes" in response["error"]["message"]
    body = {**COMPLETION, "prompt": [[5, 6]] * 3, "n": 3}
    status, response = strict_server.request("POST", "/v1/completions", body)
    assert status == 400 and "at most 8 per request" in response["error"]["message"]
    body = {**COMPLETION, "prompt": [[5, 6]] * 4, "n": 2}
    assert strict_server.request("POST", "/v1/completions", body)[0] == 200


def _stream(port: int, body: dict, started: threading.Event, out: list) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}))
    response = conn.getresponse()
    for raw in response:
        if line := raw.decode().strip():
            out.append(line)
            started.set()
    conn.close()


def test_shutdown_past_the_grace_fails_requests_cleanly(tiny_qwen3_dir, tmp_path) -> None:
    server = Server(
        tiny_qwen3_dir, str(tmp_path / "server.log"), "--timeout-graceful-shutdown", "0.5"
    )
    long = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 500, "ignore_eos": True}
    started, lines, plain = threading.Event(), [], []
    threads = [
        threading.Thread(target=_stream, args=(server.port, long, started, lines)),
        threading.Thread(
            target=lambda: plain.append(server.request("POST", "/v1/completions", long))
        ),
    ]
    for thread in threads:
        thread.start()
    try:
        assert started.wait(30)
        time.sleep(0.2)  # the plain request is in too
        code = server.stop(signal.SIGTERM)
    finally:
        for thread in threads:
            thread.join(20)
    assert code == 0
    error = json.loads(lines[-2][len("data: ") :])["error"]
    assert error["code"] == 503 and "shutting down" in error["message"]
    assert lines[-1] == "data: [DONE]"
    status, body = plain[0]
    assert status == 503 and body["error"]["message"] == "the server is shutting down"
    with open(server.log.name) as f:
        log = f.read()
    assert "Traceback" not in log and "failing 2 open request(s)" in log
