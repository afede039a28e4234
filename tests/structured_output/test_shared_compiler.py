"""shared_compiler builds a tokenizer's grammar backend once per process, also when many
threads ask at once (an engine's background build, and offline callers that check specs from
threads of their own): the others wait for that build instead of making their own."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from minivllm.structured_output import manager


def test_threads_that_ask_together_share_one_build(monkeypatch) -> None:
    builds: list[str] = []

    class SlowBackend:
        def __init__(self, tokenizer, vocab_size):
            builds.append(threading.current_thread().name)
            time.sleep(0.2)  # the tokenizer and llguidance's trie take about a second

    monkeypatch.setattr(manager, "load_tokenizer", lambda path: path)
    monkeypatch.setattr(manager, "LLGuidanceBackend", SlowBackend)
    # A key no other test builds: the cache is the process's.
    key = ("/nonexistent/tokenizer-for-the-race", 12345)
    with ThreadPoolExecutor(8) as pool:
        compilers = list(pool.map(lambda _: manager.shared_compiler(*key), range(16)))
    assert len(builds) == 1
    assert all(c is compilers[0] for c in compilers)
    assert manager.shared_compiler(*key) is compilers[0]


def test_a_background_build_returns_at_once_and_the_first_request_reuses_it(monkeypatch) -> None:
    builds: list[str] = []

    class SlowBackend:
        def __init__(self, tokenizer, vocab_size):
            builds.append(threading.current_thread().name)
            time.sleep(0.2)

    monkeypatch.setattr(manager, "load_tokenizer", lambda path: path)
    monkeypatch.setattr(manager, "LLGuidanceBackend", SlowBackend)
    key = ("/nonexistent/tokenizer-for-the-prebuild", 23456)
    start = time.perf_counter()
    built = manager.build_in_background(*key)
    assert time.perf_counter() - start < 0.1  # returns at once: the build is the thread's
    built.result(5)
    assert builds == ["minivllm-grammar-backend"]
    start = time.perf_counter()
    manager.shared_compiler(*key)
    assert time.perf_counter() - start < 0.1 and len(builds) == 1  # built, not again


def test_a_failed_build_is_reported_by_a_check_and_built_again_by_the_next(monkeypatch) -> None:
    """A failed background build is not kept: a check reports its error, naming the problem,
    as a fault of the engine (not of the spec), and the next check builds again."""
    from minivllm.structured_output.params import StructuredOutputsParams

    attempts: list[str] = []

    def broken(path):
        attempts.append(path)
        raise OSError(f"no tokenizer at {path}")

    monkeypatch.setattr(manager, "load_tokenizer", broken)
    engine_manager = manager.StructuredOutputManager("/nonexistent/tokenizer-that-fails", 34567, 4)
    spec = StructuredOutputsParams(regex="a+").spec_key()
    for expected_attempts in (1, 2):
        outcome = engine_manager.check(spec).result(5)
        assert outcome.error == "unavailable"
        assert "no tokenizer at /nonexistent/tokenizer-that-fails" in outcome.message
        assert len(attempts) == expected_attempts


@pytest.mark.parametrize("usage_context", ["offline", "server"])
def test_a_server_core_starts_its_backend_build_once_started(
    tiny_qwen3_dir: str, usage_context: str
) -> None:
    """A server's core starts the build when it has started; an offline engine waits for its
    first constrained request (most offline runs have none)."""
    from minivllm.config import EngineConfig
    from minivllm.engine.engine_core import EngineCore
    from minivllm.models.model_config import ModelConfig

    config = EngineConfig.from_options(
        tiny_qwen3_dir,
        usage_context=usage_context,
        dtype="float32",
        device="cpu",
        num_gpu_blocks_override=16,
    )
    core = EngineCore(config, ModelConfig.from_hf(tiny_qwen3_dir))
    try:
        started = core.structured_outputs._compiler is not None
        assert started == (usage_context == "server")
    finally:
        core.shutdown()


def test_the_servers_frontend_builds_no_grammar_backend(monkeypatch) -> None:
    """The engine core compiles every spec, the frontend's checks included: the frontend's
    process builds no backend (no tokenizer trie, no compile cache) at startup."""
    from types import SimpleNamespace

    from starlette.testclient import TestClient

    from minivllm.entrypoints.server import app as server
    from minivllm.entrypoints.server.metrics import ServerMetrics
    from minivllm.entrypoints.server.serving_common import ServerState

    builds: list[tuple] = []
    monkeypatch.setattr(manager, "build_in_background", lambda *key: builds.append(key))
    monkeypatch.setattr(manager, "shared_compiler", lambda *key: builds.append(key))
    # The lifespan freezes the heap for a server's life: not this test process's.
    monkeypatch.setattr(server.gc, "freeze", lambda: None)
    engine = SimpleNamespace(
        attach_loop=lambda loop: None,
        shutdown=lambda: None,
        config=SimpleNamespace(resolved_tokenizer=lambda: "/models/m", grammar_cache_bytes=4096),
        info=SimpleNamespace(vocab_size=1234),
    )
    app = server.build_app(ServerState(engine, ["m"]), ServerMetrics("m-prebuild"))
    with TestClient(app):  # runs the lifespan
        assert builds == []
