"""GrammarCompiler: compiles specs on threads of their own behind an LRU cache of futures,
bounded in entries and in bytes, so the engine loop never waits on a compile; a compile past
its time limit fails its requests and gives its worker back at once; a frontend's check is
refused at once while no worker is free."""

from __future__ import annotations

import os
import sys
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
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
    """No compile worker is free and the spec is not cached: a frontend's check says so
    (503 with Retry-After) rather than queueing behind other requests' compiles."""

    def __init__(self, num_workers: int, retry_after_s: int = 1) -> None:
        super().__init__(
            f"the structured output compiler is busy: its {num_workers} workers are compiling "
            "other requests' grammars; retry shortly"
        )
        self.num_workers = num_workers
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class CompileCacheInfo:
    hits: int  # submits answered by a cached or running compile
    misses: int  # submits that started (or queued) a compile
    size: int  # specs held now
    num_bytes: int = 0  # the compiled grammars' estimated bytes (backend.grammar_bytes)
    num_running: int = 0  # compile threads running now, timed-out ones included
    num_timed_out: int = 0  # of those, the ones past their time limit (they hold no worker)


@dataclass(eq=False)
class _Compile:
    """One backend compile of a spec, from its start (on a thread of its own) to its end."""

    spec: StructuredOutputSpec
    future: Future[CompiledGrammar]  # what its outcome settles: the latest submit's future
    timed_out: bool = False  # past its time limit: it runs on without holding a worker
    thread_id: int | None = None  # its thread's native id, once it runs


# The nice value of a timed-out compile's thread: the lowest priority, so that what it still
# burns comes after the engine loop and the compiles within their limits.
TIMED_OUT_NICE = 19


def lower_thread_priority(thread_id: int) -> None:
    """Gives one thread of this process the lowest CPU priority (Linux, where a thread's nice
    value is its own; elsewhere nothing). Raising nice needs no privilege."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, thread_id, TIMED_OUT_NICE)
        except OSError:
            pass


class GrammarCompiler:
    """Futures of compiled grammars, one per spec while it stays in the cache.

    cache_size: specs kept (least recently submitted evicted first); cache_bytes: the
    bound on their estimated bytes (backend.grammar_bytes, counted once compiled; an entry
    larger than the bound is not kept). A failed compile (ValueError) stays cached, since it
    fails again. time_limit_s: seconds from submit to result, queueing included (None: no
    limit); past it the future fails and leaves the cache, and the compile gives its worker
    back: a thread cannot be stopped, so it runs on at the lowest CPU priority (llguidance has
    no way to stop a build, and its fuel does not bound a JSON schema's conversion), and where
    it ends its outcome is cached; a submit of its spec meanwhile waits for it. At most
    max_workers compiles hold a worker, and at most 2 x max_workers threads compile at once
    (timed-out ones included); while no worker is free, submit(..., refuse_when_busy=True)
    raises CompilerBusy for a spec that is neither cached nor compiling.
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
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        if time_limit_s is not None and time_limit_s <= 0:
            raise ValueError(f"time_limit_s must be positive or None, got {time_limit_s}")
        self._backend = backend
        self._cache_size = cache_size
        self._cache_bytes = cache_bytes
        self._max_workers = max_workers
        self._time_limit_s = time_limit_s
        self._lock = threading.Lock()  # guards everything below
        # Separate, because setting an outcome runs the future's callbacks, which may submit.
        self._outcome_lock = threading.Lock()
        self._cache: OrderedDict[StructuredOutputSpec, Future[CompiledGrammar]] = OrderedDict()
        self._sizes: dict[StructuredOutputSpec, int] = {}  # the compiled entries' bytes
        self._running: dict[StructuredOutputSpec, _Compile] = {}  # one thread each
        self._queued: deque[_Compile] = deque()  # waiting for a worker
        self._num_workers_busy = 0  # running compiles within their time limit
        self._num_bytes = 0
        self._hits = 0
        self._misses = 0
        self._closed = False

    def submit(
        self, spec: StructuredOutputSpec, refuse_when_busy: bool = False
    ) -> Future[CompiledGrammar]:
        """The future of spec's compiled grammar; returns at once. Its exception is a
        ValueError for a spec the backend rejects or a compile past the time limit.
        refuse_when_busy: raise CompilerBusy rather than queue a compile while no worker is
        free (a cached or compiling spec is answered all the same)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the grammar compiler is shut down")
            cached = self._cache.get(spec)
            if cached is not None:
                self._cache.move_to_end(spec)
                self._hits += 1
                return cached
            running = self._running.get(spec)
            if running is None and refuse_when_busy and not self._may_start():
                raise CompilerBusy(self._max_workers)
            if running is not None and not running.future.done():  # evicted while compiling
                future = running.future
            else:
                future = Future()
            self._cache[spec] = future
            if len(self._cache) > self._cache_size:
                self._evict_oldest()  # in-flight waiters keep their future
            started = None
            if running is not None:
                self._hits += 1
                if running.future is future:
                    return future
                running.future = future  # timed out, running on: its outcome is this submit's
            else:
                self._misses += 1
                self._queued.append(_Compile(spec, future))
                started = self._start_queued()
        self._start_timer(spec, future)
        self._start_threads(started)
        return future

    @property
    def backend(self) -> StructuredOutputBackend:
        return self._backend

    def cache_info(self) -> CompileCacheInfo:
        with self._lock:
            num_running = len(self._running)
            return CompileCacheInfo(
                self._hits,
                self._misses,
                len(self._cache),
                self._num_bytes,
                num_running,
                num_running - self._num_workers_busy,
            )

    def shutdown(self) -> None:
        """Stops taking work; running compiles end on their own, queued ones fail."""
        with self._lock:
            self._closed = True
            queued, self._queued = list(self._queued), deque()
        error = RuntimeError("the grammar compiler was shut down")
        for entry in queued:
            self._settle(entry.future, lambda future=entry.future: future.set_exception(error))

    # ---- internals ------------------------------------------------------------------------

    def _may_start(self) -> bool:
        """A worker is free, and the threads of timed-out compiles leave room (lock held)."""
        return (
            self._num_workers_busy < self._max_workers
            and len(self._running) < 2 * self._max_workers
        )

    def _start_queued(self) -> list[_Compile]:
        """Moves queued compiles onto workers while some are free (lock held); the caller
        starts their threads once the lock is released."""
        started = []
        while self._queued and self._may_start() and not self._closed:
            entry = self._queued.popleft()
            self._running[entry.spec] = entry
            self._num_workers_busy += 1
            started.append(entry)
        return started

    def _start_threads(self, started: list[_Compile] | None) -> None:
        for entry in started or ():
            threading.Thread(
                target=self._run, args=(entry,), name="minivllm-grammar", daemon=True
            ).start()

    def _run(self, entry: _Compile) -> None:
        with self._lock:
            entry.thread_id = threading.get_native_id()
            if entry.timed_out:  # timed out before the thread got here
                lower_thread_priority(entry.thread_id)
        try:
            outcome: Any = self._backend.compile(entry.spec)
        except Exception as e:  # noqa: BLE001 - the requests of this spec fail with it
            outcome = e
        self._finish(entry, outcome)

    def _start_timer(self, spec: StructuredOutputSpec, future: Future[CompiledGrammar]) -> None:
        if self._time_limit_s is None:
            return
        timer = threading.Timer(self._time_limit_s, self._expire, (spec, future))
        timer.daemon = True
        timer.start()
        future.add_done_callback(lambda _: timer.cancel())

    def _expire(self, spec: StructuredOutputSpec, future: Future[CompiledGrammar]) -> None:
        error = ValueError(
            f"compiling the structured output {spec.kind} took longer than the "
            f"{self._time_limit_s:g} s time limit"
        )
        if not self._settle(future, lambda: future.set_exception(error)):
            return
        with self._lock:
            if self._cache.get(spec) is future:
                self._forget(spec)
            entry = self._running.get(spec)
            if entry is not None and entry.future is future and not entry.timed_out:
                entry.timed_out = True  # it runs on; its worker takes the next compile
                self._num_workers_busy -= 1
                if entry.thread_id is not None:  # still compiling: the id is its thread's
                    lower_thread_priority(entry.thread_id)
            self._queued = deque(e for e in self._queued if e.future is not future)
            started = self._start_queued()
        self._start_threads(started)

    def _finish(self, entry: _Compile, outcome: Any) -> None:
        with self._lock:
            del self._running[entry.spec]
            if not entry.timed_out:
                self._num_workers_busy -= 1
            future = entry.future
            keep = isinstance(outcome, ValueError) or not isinstance(outcome, Exception)
            if future.done() and keep and entry.spec not in self._cache and not self._closed:
                # Timed out and not asked for since: keep what it made for the next request.
                future = Future()
                self._cache[entry.spec] = future
                if len(self._cache) > self._cache_size:
                    self._evict_oldest()
            started = self._start_queued()
        if isinstance(outcome, Exception):
            self._settle(future, lambda: future.set_exception(outcome))
        elif self._settle(future, lambda: future.set_result(outcome)):
            self._count_bytes(entry.spec, future, outcome)
        self._start_threads(started)

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

    def _settle(self, future: Future[CompiledGrammar], set_outcome: Callable[[], None]) -> bool:
        """Sets future's outcome unless the timer or the compile already did; True if set."""
        with self._outcome_lock:
            if future.done():
                return False
            set_outcome()
            return True
