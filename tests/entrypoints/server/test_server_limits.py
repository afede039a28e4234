"""One request must never hurt another: huge or many prompts are refused cheaply, heavy text
work runs off the event loop, bodies have a size limit, every path but two needs the key.
(Read deadlines and shutdown: test_server_deadlines.py.)"""

from __future__ import annotations

import asyncio
import http.client
import socket
import threading
import time
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from minivllm.engine.request_checks import check_request
from minivllm.entrypoints.async_tokenizer import AsyncTokenizer
from minivllm.entrypoints.server.app import build_app
from minivllm.entrypoints.server.metrics import ServerMetrics
from minivllm.entrypoints.server.serving_common import ServerState, submit
from minivllm.entrypoints.server.streaming import DeltaCursor
from minivllm.outputs import CompletionOutput
from minivllm.sampling_params import SamplingParams
from minivllm.tokenizer import load_tokenizer
from tests.entrypoints.conftest import API_KEY, MODEL_NAME, read_response

COMPLETION = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2}


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) << 10


class _Probe:
    """GET /health in a loop on its own connection; `worst` is the slowest answer (s)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self._stop.is_set():
            start = time.perf_counter()
            conn.request("GET", "/health")
            conn.getresponse().read()
            self.worst = max(self.worst, time.perf_counter() - start)
            time.sleep(0.01)
        conn.close()

    def __enter__(self) -> _Probe:
        self._thread.start()
        time.sleep(0.1)
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join(30)


def _timed(server, path: str, body, headers) -> tuple[int, dict, float]:
    start = time.perf_counter()
    status, response = server.request("POST", path, body, headers)
    return status, response, time.perf_counter() - start


def test_huge_text_prompt_is_refused_before_it_is_tokenized(server, auth) -> None:
    rss = _rss_bytes(server.proc.pid)
    body = {**COMPLETION, "prompt": "hello world " * 650_000}  # 7.8 M characters
    status, response, seconds = _timed(server, "/v1/completions", body, auth)
    assert status == 400 and response["error"]["param"] == "prompt", response
    assert "maximum context length is 512" in response["error"]["message"]
    assert seconds < 2.0  # it was 9-12 s of tokenizing
    assert _rss_bytes(server.proc.pid) - rss < 200 << 20  # it was ~1 GB more
    chat = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi " * 2_000_000}]}
    status, response, seconds = _timed(server, "/v1/chat/completions", chat, auth)
    assert status == 400 and "maximum context length" in response["error"]["message"]
    assert seconds < 2.0


def test_prompt_length_is_checked_before_the_ids() -> None:
    info = SimpleNamespace(vocab_size=500, max_model_len=512, block_size=4, num_blocks=512)
    with pytest.raises(ValueError, match="maximum context length is 512"):
        check_request([10**9] * 1000, SamplingParams(max_tokens=1), info, 20)


def test_too_many_prompts_is_a_quick_400_and_others_are_served(server, auth) -> None:
    body = {**COMPLETION, "prompt": [[5, 6, 7]] * 100_000, "max_tokens": 1}
    with _Probe(server.port) as probe:
        status, response, seconds = _timed(server, "/v1/completions", body, auth)
    assert status == 400 and "--max-prompts-per-request" in response["error"]["message"]
    assert "100000 prompt(s) x n=1" in response["error"]["message"]
    # Before: 99,740 requests queued, a 4.9 s stall, no answer within a minute. (The bounds
    # are loose: the machine running the tests may be busy.)
    assert seconds < 5.0 and probe.worst < 2.0
    # prompts x n counts: 9 prompts x n=128 is over 1,024 too.
    many_n = {**COMPLETION, "prompt": ["a"] * 9, "n": 128}
    status, response = server.request("POST", "/v1/completions", many_n, auth)
    assert status == 400 and "1152 completions" in response["error"]["message"]


def test_submission_of_many_prompts_lets_other_tasks_run() -> None:
    """submit() yields to the loop between slices of sub-requests (fair admission)."""
    events: list[str] = []
    engine = SimpleNamespace(
        validate=lambda ids, params: events.append("validate"),
        validate_options=lambda salt, priority: None,
        add_validated_requests=lambda reqs, salt, priority: [
            events.append("add") or iter(()) for _ in reqs
        ],
        abort=lambda request_id: None,
    )
    state = ServerState(engine, ["m"], log_requests=False)
    prompts = [(None, [1, 2], SamplingParams(max_tokens=1))] * 200

    async def other() -> None:
        for _ in range(100):
            events.append("other")
            await asyncio.sleep(0)

    async def run() -> None:
        task = asyncio.create_task(other())
        await asyncio.sleep(0)  # the other task starts first, then each yields in turn
        assert len(await submit(state, "r", prompts)) == 200
        await task

    asyncio.run(run())
    adds = [i for i, event in enumerate(events) if event == "add"]
    assert "other" in events[adds[0] : adds[-1]]  # the other task ran between the slices
    assert events.count("validate") == 200  # each prompt once, all before the first add
    assert events.index("add") > max(i for i, e in enumerate(events) if e == "validate")


def test_chat_template_runs_off_the_loop(server, auth) -> None:
    messages = [{"role": "user", "content": f"m{i}"} for i in range(100_000)]
    chat = {"model": MODEL_NAME, "messages": messages, "max_tokens": 1}
    with _Probe(server.port) as probe:
        status, response, _ = _timed(server, "/v1/chat/completions", chat, auth)
    assert status == 400 and "maximum context length" in response["error"]["message"]
    assert probe.worst < 1.2, probe.worst  # other clients waited 1.7-2.5 s before, 0.3 s now
    status, response = server.request("POST", "/detokenize", {"tokens": [5] * 1_000_000}, auth)
    assert status == 200 and response["prompt"]
    status, response = server.request("POST", "/detokenize", {"tokens": [5, 10**9]}, auth)
    assert status == 400 and response["error"]["param"] == "tokens"


class _ThreadRecorder:
    """A tokenizer that notes on which thread its text work runs."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.threads: dict[str, str] = {}

    def __getattr__(self, name: str):
        attr = getattr(self._tokenizer, name)
        if name not in ("decode", "apply_chat_template", "convert_ids_to_tokens"):
            return attr

        def recorded(*args, **kwargs):
            self.threads[name] = threading.current_thread().name
            return attr(*args, **kwargs)

        return recorded


def test_text_work_of_the_routes_runs_on_tokenizer_threads(tiny_qwen3_dir) -> None:
    """/detokenize, chat templates and token_strs never run on the event loop's thread."""
    recorder = _ThreadRecorder(load_tokenizer(tiny_qwen3_dir))
    async_tokenizer = AsyncTokenizer(recorder)
    engine = SimpleNamespace(
        tokenizer=recorder,
        async_tokenizer=async_tokenizer,
        encode=async_tokenizer.encode,
        info=SimpleNamespace(vocab_size=500),
        max_model_len=512,
    )
    app = build_app(ServerState(engine, [MODEL_NAME]), ServerMetrics(MODEL_NAME))
    chat = {"messages": [{"role": "user", "content": "Hi"}], "return_token_strs": True}

    client = TestClient(app)  # no lifespan: the routes alone, on the client's event loop
    try:
        assert client.post("/detokenize", json={"tokens": [5, 6]}).status_code == 200
        assert client.post("/tokenize", json=chat).status_code == 200
    finally:
        async_tokenizer.shutdown()
    assert set(recorder.threads) == {"decode", "apply_chat_template", "convert_ids_to_tokens"}
    assert all(name.startswith("tokenizer") for name in recorder.threads.values())


def test_body_size_is_refused_from_content_length_before_the_body(server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + API_KEY.encode() + b"\r\n"
            b"Content-Length: 1000000000\r\n\r\n{"
        )
        head = read_response(sock)  # no body sent: the answer must not wait for it
    assert head.startswith("HTTP/1.1 413"), head
    assert "larger than 8388608 bytes" in head


def test_api_key_covers_every_path_but_health_and_metrics(server, auth) -> None:
    for method, path in [
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("GET", "/version"),
        ("GET", "/docs"),
        ("GET", "/openapi.json"),
        ("GET", "/redoc"),
        ("GET", "/v1/models"),
    ]:
        status, body = server.request(method, path, {"prompt": "x"} if method == "POST" else None)
        assert status == 401 and body["error"]["code"] == 401, path
    assert server.request("POST", "/tokenize", {"prompt": "x"}, auth)[0] == 200
    assert server.request("GET", "/health")[0] == 200
    assert server.request("GET", "/metrics")[0] == 200


def test_delta_cursor_sends_each_delta_once() -> None:
    cursor = DeltaCursor()

    def choice(text: str, num_tokens: int, finish: str | None = None) -> CompletionOutput:
        return CompletionOutput(0, text, list(range(num_tokens)), finish_reason=finish)

    assert cursor.is_new(0)
    assert cursor.advance(0, choice("", 0)) is None
    assert cursor.advance(0, choice("", 0), force=True) == ("", 0)  # echo's first chunk
    assert not cursor.is_new(0)
    assert cursor.advance(0, choice("ab", 1)) == ("ab", 0)
    assert cursor.advance(0, choice("ab", 2)) == ("", 1)  # a token with no text yet
    assert cursor.advance(0, choice("ab", 2)) is None
    assert cursor.advance(0, choice("abc", 3, "stop")) == ("c", 2)
    assert cursor.advance(0, choice("abc", 3, "stop")) is None  # nothing after the last
