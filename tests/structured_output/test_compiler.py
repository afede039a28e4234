"""GrammarCompiler: LRU cache of futures, shared in-flight compiles, cached failures, the
time limit, and a done-callback that submits again."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from minivllm.structured_output import (
    GrammarCompiler,
    StructuredOutputsParams,
    StructuredOutputSpec,
)
from minivllm.structured_output.compiler import CompilerBusy


@dataclass(frozen=True)
class FakeGrammar:
    spec: StructuredOutputSpec


class FakeBackend:
    """compile() blocks on `release` for specs whose text starts with "slow"."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.compiled: list[StructuredOutputSpec] = []

    def compile(self, spec: StructuredOutputSpec) -> FakeGrammar:
        if spec.text.startswith("slow"):
            self.release.wait(10)
        if spec.text == "bad":
            raise ValueError("invalid structured output regex: bad")
        self.compiled.append(spec)
        return FakeGrammar(spec)

    def grammar_bytes(self, grammar: FakeGrammar) -> int:
        return 100 * len(grammar.spec.text)  # "aaa": 300 bytes


def regex(text: str) -> StructuredOutputSpec:
    return StructuredOutputsParams(regex=text).spec_key()


@pytest.fixture
def backend():
    backend = FakeBackend()
    yield backend
    backend.release.set()


def test_cache_hit_and_lru_eviction(backend):
    compiler = GrammarCompiler(backend, cache_size=2, time_limit_s=None)
    first = compiler.submit(regex("a"))
    assert first.result(5).spec == regex("a")
    assert compiler.submit(regex("a")) is first
    compiler.submit(regex("b")).result(5)
    compiler.submit(regex("a"))  # a is now the most recent: b goes first
    compiler.submit(regex("c")).result(5)
    assert compiler.submit(regex("a")) is first
    compiler.submit(regex("b")).result(5)
    assert backend.compiled.count(regex("b")) == 2 and backend.compiled.count(regex("a")) == 1
    info = compiler.cache_info()
    assert (info.hits, info.misses, info.size) == (3, 4, 2)
    compiler.shutdown()


def test_same_spec_while_compiling_shares_the_future(backend):
    compiler = GrammarCompiler(backend, time_limit_s=None)
    futures = [compiler.submit(regex("slow")) for _ in range(3)]
    assert all(f is futures[0] for f in futures) and not futures[0].done()
    backend.release.set()
    assert futures[0].result(5).spec == regex("slow")
    assert backend.compiled == [regex("slow")]
    compiler.shutdown()


def test_a_failed_compile_is_cached(backend):
    compiler = GrammarCompiler(backend, time_limit_s=None)
    with pytest.raises(ValueError, match="invalid structured output regex: bad"):
        compiler.submit(regex("bad")).result(5)
    assert compiler.submit(regex("bad")).exception(5) is not None
    assert compiler.cache_info().misses == 1
    compiler.shutdown()


def test_time_limit_fails_that_request_alone(backend):
    compiler = GrammarCompiler(backend, max_workers=2, time_limit_s=0.05)
    slow = compiler.submit(regex("slow"))
    fast = compiler.submit(regex("fast"))
    with pytest.raises(ValueError, match="regex took longer than the 0.05 s time limit"):
        slow.result(5)
    assert fast.result(5).spec == regex("fast")
    retry = compiler.submit(regex("slow"))  # the timed-out spec was dropped from the cache
    assert retry is not slow and compiler.cache_info().misses == 3
    backend.release.set()
    assert retry.result(5).spec == regex("slow")
    compiler.shutdown()


def test_a_callback_may_submit(backend):
    compiler = GrammarCompiler(backend, time_limit_s=5.0)
    chained = []
    submitted = threading.Event()

    def submit_again(_) -> None:
        chained.append(compiler.submit(regex("b")))
        submitted.set()

    compiler.submit(regex("a")).add_done_callback(submit_again)
    assert submitted.wait(5)
    assert chained[0].result(5).spec == regex("b")
    compiler.shutdown()


def test_bad_arguments(backend):
    with pytest.raises(ValueError, match="cache_size"):
        GrammarCompiler(backend, cache_size=0)
    with pytest.raises(ValueError, match="time_limit_s"):
        GrammarCompiler(backend, time_limit_s=0)
    compiler = GrammarCompiler(backend)
    compiler.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        compiler.submit(regex("a"))


def test_real_backend_compile_through_the_cache(tiny_backend):
    compiler = GrammarCompiler(tiny_backend)
    spec = StructuredOutputsParams(json={"type": "object"}).spec_key()
    grammar = compiler.submit(spec).result(30)
    assert compiler.submit(spec).result(0) is grammar
    with pytest.raises(ValueError, match="Invalid type: nope"):
        compiler.submit(StructuredOutputsParams(json={"type": "nope"}).spec_key()).result(30)
    compiler.shutdown()


def test_the_cache_is_bounded_in_bytes(backend):
    compiler = GrammarCompiler(backend, cache_bytes=500, time_limit_s=None)
    first = compiler.submit(regex("aa"))
    first.result(5)
    compiler.submit(regex("bb")).result(5)
    assert compiler.cache_info().num_bytes == 400
    compiler.submit(regex("ccc")).result(5)  # 700 bytes: the oldest goes
    info = compiler.cache_info()
    assert (info.size, info.num_bytes) == (2, 500)
    assert compiler.submit(regex("aa")) is not first  # compiled again
    big = compiler.submit(regex("x" * 6))  # 600 bytes, more than the whole bound
    assert big.result(5).spec == regex("x" * 6)  # its waiters get it; the cache keeps none of it
    assert compiler.cache_info().num_bytes <= 500
    assert compiler.submit(regex("x" * 6)) is not big
    compiler.shutdown()


def test_a_check_is_refused_while_every_worker_is_busy(backend):
    compiler = GrammarCompiler(backend, max_workers=2, time_limit_s=0.2)
    slow = [compiler.submit(regex(f"slow{i}")) for i in range(2)]
    with pytest.raises(CompilerBusy, match="its 2 workers are compiling"):
        compiler.submit(regex("small"), refuse_when_busy=True)
    assert compiler.submit(regex("slow0"), refuse_when_busy=True) is slow[0]  # cached: served
    # Timed out, but their threads still run: the workers are busy until they end.
    with pytest.raises(ValueError, match="time limit"):
        slow[0].result(5)
    with pytest.raises(CompilerBusy):
        compiler.submit(regex("small"), refuse_when_busy=True)
    assert compiler.cache_info().num_running == 2
    backend.release.set()
    deadline = time.monotonic() + 5
    while compiler.cache_info().num_running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert compiler.submit(regex("small"), refuse_when_busy=True).result(5).spec == regex("small")
    compiler.shutdown()
