"""GrammarCompiler: compiles specs on a thread pool behind an LRU cache of futures, bounded in
entries and in bytes, so the engine loop never waits on a compile; a compile past its time
limit fails its requests; a frontend's check is refused at once while every worker is busy."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from minivllm.structured_output.backend import CompiledGrammar, StructuredOutputBackend
from minivllm.structured_output.params import StructuredOutputSpec


def compile_result(
    future: Future[CompiledGrammar], timeout: float | None = None
) -> CompiledGrammar:
    """future.result(timeout), but a failed compile raises a new exception with its type and
    message, not the future's own. The cache keeps a failed compile's future (it fails again)
    and every request of its spec reads it: each raise of one exception object would add the
    raiser's frames to its traceback, and with them what they hold (an LLM, its engine) for
    as long as the cache holds the future."""
    error = future.exception(timeout)
    if error is not None:
        raise type(error)(*error.args) from None
    return future.result()


# The cache's default byte bound, per process (GrammarBackend.grammar_bytes estimates each).
DEFAULT_CACHE_BYTES = 512 << 20


class CompilerBusy(RuntimeError):
    """Every compile worker is busy and the spec is not cached: a frontend's check says so
    (503 with Retry-After) rather than queueing behind other requests' compiles."""

    def __init__(self, num_workers: int, retry_after_s: int = 1) -> None:
        super().__init__(
            f"the structured output compiler is busy: its {num_workers} workers are compiling "
            "other requests' grammars; retry shortly"
        )
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class CompileCacheInfo:
    hits: int  # submits answered by a cached or in-flight future
    misses: int  # submits that started a compile
    size: int  # specs held now
    num_bytes: int = 0  # the compiled grammars' estimated bytes (backend.grammar_bytes)
    num_running: int = 0  # compiles on a worker now (a timed-out one until it ends)


class GrammarCompiler:
    """Futures of compiled grammars, one per spec while it stays in the cache.

    cache_size: specs kept (least recently submitted evicted first); cache_bytes: the
    bound on their estimated bytes (backend.grammar_bytes, counted once compiled; an entry
    larger than the bound is not kept). A failed compile (ValueError) stays cached, since it
    fails again; a timed-out one is dropped, so a later request retries. time_limit_s:
    seconds from submit to result, queueing included (None: no limit). A timed-out compile
    keeps its worker until it ends: threads cannot be stopped, which is why llguidance's
    parser limits and the backend's size limit bound the work itself; while every worker is
    busy, submit(..., refuse_when_busy=True) raises CompilerBusy for an uncached spec.
    """

    def __init__(
        self,
        backend: StructuredOutputBackend,
        *,
        cache_size: int = 256,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_workers: int = 2,
        time_limit_s: float | None = 30.0,
    ) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size must be at least 1, got {cache_size}")
        if time_limit_s is not None and time_limit_s <= 0:
            raise ValueError(f"time_limit_s must be positive or None, got {time_limit_s}")
        self._backend = backend
        self._cache_size = cache_size
        self._cache_bytes = cache_bytes
        self._max_workers = max_workers
        self._time_limit_s = time_limit_s
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="minivllm-grammar")
        self._lock = threading.Lock()  # guards _cache and the counters
        # Separate, because setting an outcome runs the future's callbacks, which may submit.
        self._outcome_lock = threading.Lock()
        self._cache: OrderedDict[StructuredOutputSpec, Future[CompiledGrammar]] = OrderedDict()
        self._sizes: dict[StructuredOutputSpec, int] = {}  # the compiled entries' bytes
        self._num_bytes = 0
        self._num_running = 0
        self._hits = 0
        self._misses = 0
        self._closed = False

    def submit(
        self, spec: StructuredOutputSpec, refuse_when_busy: bool = False
    ) -> Future[CompiledGrammar]:
        """The future of spec's compiled grammar; returns at once. Its exception is a
        ValueError for a spec the backend rejects or a compile past the time limit.
        refuse_when_busy: raise CompilerBusy rather than queue a compile while every worker
        is busy (a cached or in-flight spec is answered all the same)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the grammar compiler is shut down")
            cached = self._cache.get(spec)
            if cached is not None:
                self._cache.move_to_end(spec)
                self._hits += 1
                return cached
            if refuse_when_busy and self._num_running >= self._max_workers:
                raise CompilerBusy(self._max_workers)
            self._misses += 1
            self._num_running += 1
            future: Future[CompiledGrammar] = Future()
            self._cache[spec] = future
            if len(self._cache) > self._cache_size:
                self._evict_oldest()  # in-flight waiters keep their future
        timer = self._start_timer(spec, future)
        work = self._pool.submit(self._backend.compile, spec)
        work.add_done_callback(lambda done: self._finish(spec, future, done, timer))
        return future

    @property
    def backend(self) -> StructuredOutputBackend:
        return self._backend

    def cache_info(self) -> CompileCacheInfo:
        with self._lock:
            return CompileCacheInfo(
                self._hits, self._misses, len(self._cache), self._num_bytes, self._num_running
            )

    def shutdown(self) -> None:
        """Stops taking work; running compiles end on their own, queued ones fail."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _start_timer(
        self, spec: StructuredOutputSpec, future: Future[CompiledGrammar]
    ) -> threading.Timer | None:
        if self._time_limit_s is None:
            return None
        timer = threading.Timer(self._time_limit_s, self._expire, (spec, future))
        timer.daemon = True
        timer.start()
        return timer

    def _expire(self, spec: StructuredOutputSpec, future: Future[CompiledGrammar]) -> None:
        error = ValueError(
            f"compiling the structured output {spec.kind} took longer than the "
            f"{self._time_limit_s:g} s time limit"
        )
        if self._settle(future, lambda: future.set_exception(error)):
            with self._lock:
                if self._cache.get(spec) is future:
                    self._forget(spec)

    def _evict_oldest(self) -> None:
        """Drops the least recently submitted entry (lock held)."""
        self._forget(next(iter(self._cache)))

    def _forget(self, spec: StructuredOutputSpec) -> None:
        """Drops spec's entry and its bytes (lock held)."""
        del self._cache[spec]
        self._num_bytes -= self._sizes.pop(spec, 0)

    def _count_bytes(self, spec: StructuredOutputSpec, future: Future, grammar: Any) -> None:
        """Counts a finished compile's bytes while its entry is cached, then evicts the least
        recently submitted entries past cache_bytes (the new one last: it was just asked for)."""
        num_bytes = self._backend.grammar_bytes(grammar)
        with self._lock:
            if self._cache.get(spec) is not future:
                return  # evicted or timed out meanwhile
            self._sizes[spec] = num_bytes
            self._num_bytes += num_bytes
            for oldest in [key for key in self._cache if key in self._sizes]:
                if self._num_bytes <= self._cache_bytes:
                    break
                self._forget(oldest)

    def _finish(
        self,
        spec: StructuredOutputSpec,
        future: Future[CompiledGrammar],
        done: Future[CompiledGrammar],
        timer: threading.Timer | None,
    ) -> None:
        if timer is not None:
            timer.cancel()
        with self._lock:
            self._num_running -= 1
        if done.cancelled():
            error = RuntimeError("the grammar compiler was shut down")
            self._settle(future, lambda: future.set_exception(error))
        elif done.exception() is not None:
            self._settle(future, lambda: future.set_exception(done.exception()))
        else:
            self._settle(future, lambda: future.set_result(done.result()))
            self._count_bytes(spec, future, done.result())

    def _settle(self, future: Future[CompiledGrammar], set_outcome: Callable[[], None]) -> bool:
        """Sets future's outcome unless the timer or the compile already did; True if set."""
        with self._outcome_lock:
            if future.done():
                return False
            set_outcome()
            return True
