"""GrammarCompiler: LRU cache of futures, shared in-flight compiles, cached failures, the
time limit, and a done-callback that submits again."""

from __future__ import annotations

import os
import sys
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
        self.slow_threads: list[int] = []  # native ids of the threads that compiled slowly

    def compile(self, spec: StructuredOutputSpec) -> FakeGrammar:
        if spec.text.startswith("slow"):
            self.slow_threads.append(threading.get_native_id())
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
    # The timed-out spec left the cache, but its compile runs on: a retry waits for it.
    retry = compiler.submit(regex("slow"))
    assert retry is not slow and compiler.cache_info().misses == 2
    backend.release.set()
    assert retry.result(5).spec == regex("slow")
    assert backend.compiled.count(regex("slow")) == 1
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
    compiler = GrammarCompiler(backend, max_workers=2, time_limit_s=0.5)
    slow = [compiler.submit(regex(f"slow{i}")) for i in range(2)]
    with pytest.raises(CompilerBusy, match="its 2 workers are compiling"):
        compiler.submit(regex("small"), refuse_when_busy=True)
    assert compiler.submit(regex("slow0"), refuse_when_busy=True) is slow[0]  # cached: served
    # Timed out: their threads run on, but their workers are free at once.
    for future in slow:
        with pytest.raises(ValueError, match="time limit"):
            future.result(5)
    info = compiler.cache_info()
    assert (info.num_running, info.num_timed_out) == (2, 2)
    if sys.platform.startswith("linux"):  # what they still burn comes last
        assert [os.getpriority(os.PRIO_PROCESS, t) for t in backend.slow_threads] == [19, 19]
    assert compiler.submit(regex("small"), refuse_when_busy=True).result(5).spec == regex("small")
    backend.release.set()
    compiler.shutdown()


def wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_a_timed_out_compile_is_cached_where_it_ends(backend):
    compiler = GrammarCompiler(backend, max_workers=1, time_limit_s=0.05)
    with pytest.raises(ValueError, match="time limit"):
        compiler.submit(regex("slow")).result(5)
    assert compiler.cache_info().size == 0
    backend.release.set()
    wait_until(lambda: compiler.cache_info().num_running == 0)
    late = compiler.submit(regex("slow"))
    assert late.done() and late.result().spec == regex("slow")  # no second compile
    info = compiler.cache_info()
    assert (info.misses, info.hits, info.num_bytes) == (1, 1, 400)
    compiler.shutdown()


def test_timed_out_compiles_are_bounded_at_twice_the_workers(backend):
    compiler = GrammarCompiler(backend, max_workers=1, time_limit_s=0.05)
    for i in range(2):  # each starts on the worker the one before gave back
        with pytest.raises(ValueError, match="time limit"):
            compiler.submit(regex(f"slow{i}")).result(5)
    info = compiler.cache_info()
    assert (info.num_running, info.num_timed_out) == (2, 2)
    with pytest.raises(CompilerBusy):  # two threads run on: no room for a third
        compiler.submit(regex("small"), refuse_when_busy=True)
    queued = compiler.submit(regex("small"))
    assert compiler.cache_info().num_running == 2
    backend.release.set()  # they end: the queued compile starts
    assert queued.result(5).spec == regex("small")
    compiler.shutdown()


def test_a_pathological_grammar_past_its_limit_frees_its_worker(tiny_backend):
    """A schema of eight objects of 1,000 optional properties (each at the limit) builds for
    about a second (llguidance's conversion grows with their square); one worker, a 0.1 s
    limit: the next grammar compiles at once while the long build runs on."""

    def inner(key: str) -> dict:  # distinct objects: llguidance builds each
        names = [f"{key}{i}" for i in range(1001)]
        return {"type": "object", "properties": dict.fromkeys(names, {}), "required": names[:1]}

    schema = {"type": "object", "properties": {key: inner(key) for key in "abcdefgh"}}
    heavy = StructuredOutputsParams(json=schema)
    compiler = GrammarCompiler(tiny_backend, max_workers=1, time_limit_s=0.1)
    with pytest.raises(ValueError, match="json took longer than the 0.1 s time limit"):
        compiler.submit(heavy.spec_key()).result(10)
    start = time.perf_counter()
    small = compiler.submit(regex("[ab]+c"), refuse_when_busy=True).result(10)
    elapsed = time.perf_counter() - start
    assert small.spec == regex("[ab]+c") and elapsed < 0.5
    assert compiler.cache_info().num_timed_out == 1  # the long build was still running
    compiler.shutdown()
