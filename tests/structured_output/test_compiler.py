"""GrammarCompiler: LRU cache of futures, shared in-flight compiles, cached failures, the
time limit, and a done-callback that submits again."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from minivllm.structured_output import (
    GrammarCompiler,
    StructuredOutputsParams,
    StructuredOutputSpec,
)


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
