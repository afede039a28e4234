"""The engine's side of structured outputs: one grammar backend and compiler per process and
tokenizer, a frontend's check of a spec (compiled here, where its requests will run), the
per-request matchers it hands the scheduler, and the step's bitmask that the scheduler fills."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, wait
from itertools import repeat

import numpy as np

from minivllm.structured_output.backend import (
    CompiledGrammar,
    GrammarMatcher,
    StructuredOutputBackend,
)
from minivllm.structured_output.bitmask import (
    allocate_bitmask,
    byte_token_words,
    drop_eos,
    unforced_rows,
)
from minivllm.structured_output.check import CheckOutcome
from minivllm.structured_output.compiler import DEFAULT_CACHE_BYTES, CompilerBusy, GrammarCompiler
from minivllm.structured_output.llguidance_backend import LLGuidanceBackend
from minivllm.structured_output.params import StructuredOutputsParams, StructuredOutputSpec
from minivllm.structured_output.request_state import StructuredOutputRequest, matcher_rows
from minivllm.tokenizer import load_tokenizer

# Held while shared_compiler looks up or builds. lru_cache alone lets every thread that
# misses build its own: callers that ask together (a background build, offline requests
# checked from threads of their own) would each build, taking turns on the GIL.
_building = threading.Lock()


def shared_compiler(
    tokenizer: str, vocab_size: int, cache_bytes: int = DEFAULT_CACHE_BYTES
) -> GrammarCompiler:
    """The process's compiler for one tokenizer (path) and bitmask width (the model's
    vocabulary, which may be padded past the tokenizer's). Built on first use, once:
    loading the tokenizer and llguidance's token trie takes about a second, and callers
    meanwhile wait for that build. cache_bytes: its compile cache's bound in bytes (the
    engine option grammar_cache_bytes)."""
    with _building:
        return _build_shared_compiler(tokenizer, vocab_size, cache_bytes)


@functools.lru_cache(maxsize=8)
def _build_shared_compiler(tokenizer: str, vocab_size: int, cache_bytes: int) -> GrammarCompiler:
    backend = LLGuidanceBackend(load_tokenizer(tokenizer), vocab_size=vocab_size)
    return GrammarCompiler(backend, cache_bytes=cache_bytes)


def build_in_background(
    tokenizer: str, vocab_size: int, cache_bytes: int = DEFAULT_CACHE_BYTES
) -> Future[GrammarCompiler]:
    """shared_compiler(tokenizer, vocab_size), built on a daemon thread: the future holds the
    compiler, or the ValueError saying why it could not be built. An engine's manager builds
    through it at its first constrained request, a server's two processes at start (so that
    no request waits for the build: about a second, longer while the process is busy). A
    failed build is not kept by shared_compiler: a later call builds again and gets the
    error."""
    future: Future[GrammarCompiler] = Future()
    threading.Thread(
        target=_build_compiler,
        args=(future, tokenizer, vocab_size, cache_bytes),
        name="minivllm-grammar-backend",
        daemon=True,
    ).start()
    return future


class StructuredOutputManager:
    """One engine's grammar state: makes each constrained request's matcher (its compile
    runs on the compiler's threads) and fills a step's bitmask (host int32 words, pinned on
    CUDA so that the runner's copy to the device overlaps the forward).

    The backend is built at the first constrained request, on a thread of its own (loading
    the tokenizer and llguidance's trie takes seconds): that request's compile waits for
    it, the step loop does not. An engine that never sees one never loads them.

    wait_for_compiles: new_request returns only once the compile has ended, so a request
    is ready from its first schedule on. Engines that run in lockstep (torchrun: every rank
    schedules) need it, or a compile's timing could make their schedulers disagree.
    """

    def __init__(
        self,
        tokenizer: str,
        vocab_size: int,
        max_num_seqs: int,
        pin_memory: bool = False,
        wait_for_compiles: bool = False,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        self.tokenizer = tokenizer
        self.cache_bytes = cache_bytes
        self.vocab_size = vocab_size
        self.max_num_seqs = max_num_seqs
        self.pin_memory = pin_memory
        self.wait_for_compiles = wait_for_compiles
        self._compiler: Future[GrammarCompiler] | None = None
        self._bitmask: np.ndarray | None = None

    @property
    def backend(self) -> StructuredOutputBackend:
        """The built backend (only read once some request's grammar is ready)."""
        return self._compiler_future().result().backend

    def prebuild(self) -> None:
        """Starts the backend's build now (in the background) rather than at the first
        constrained request: a server's core does this once it has started."""
        self._compiler_future()

    def new_request(
        self, params: StructuredOutputsParams, ignore_eos: bool = False
    ) -> StructuredOutputRequest:
        """The request's grammar state; its compile starts now (a cache hit when the frontend
        checked the spec in this process) and, with wait_for_compiles, has ended on return
        (a failed one fails the request at its first schedule, as without). ignore_eos: the
        request's sampling option (its masks allow EOS only where the grammar has ended)."""
        spec = params.spec_key()
        grammar = self._submit(spec)
        if self.wait_for_compiles:
            wait([grammar])
        return StructuredOutputRequest(spec, grammar, _LazyBackend(self), ignore_eos)

    def check(
        self, spec: StructuredOutputSpec, refuse_when_busy: bool = False
    ) -> Future[CheckOutcome]:
        """A frontend's check, before it queues a request of spec: the outcome of spec's
        compile here (cached: the request's own compile is a hit). refuse_when_busy: a
        "busy" outcome at once, rather than a queued compile, while no worker is free."""
        outcome: Future[CheckOutcome] = Future()

        def on_built(built: Future[GrammarCompiler]) -> None:
            if built.exception() is not None:  # e.g. an llguidance too old: not the spec's fault
                outcome.set_result(CheckOutcome("unavailable", str(built.exception())))
                return
            try:
                compiled = built.result().submit(spec, refuse_when_busy)
            except CompilerBusy as e:
                outcome.set_result(CheckOutcome.of_error(e))
                return
            compiled.add_done_callback(
                lambda done: outcome.set_result(CheckOutcome.of_compile(done))
            )

        self._compiler_future().add_done_callback(on_built)
        return outcome

    def _compiler_future(self) -> Future[GrammarCompiler]:
        """The compiler's build; one that failed is started again (shared_compiler keeps no
        failed build), so that a later request gets the error as it stands then."""
        building = self._compiler
        if building is None or (building.done() and building.exception() is not None):
            building = build_in_background(self.tokenizer, self.vocab_size, self.cache_bytes)
            self._compiler = building
        return building

    def _submit(self, spec: StructuredOutputSpec) -> Future[CompiledGrammar]:
        building = self._compiler_future()
        if building.done() and building.exception() is None:
            return building.result().submit(spec)
        grammar: Future[CompiledGrammar] = Future()
        building.add_done_callback(lambda built: _chain(built, spec, grammar))
        return grammar

    @functools.cached_property
    def _byte_words(self) -> tuple[slice | np.ndarray, np.ndarray]:
        """unforced_rows' probe of the backend's single-byte tokens (built at the first fill)."""
        return byte_token_words(self.backend.byte_token_ids)

    def fill(
        self,
        requests: Sequence[StructuredOutputRequest],
        rows: Sequence[int],
        drafts: Sequence[Sequence[int]] | None = None,
    ) -> np.ndarray:
        """The masks of the step's constrained rows: int32 [len(rows), num_words], rows of
        this manager's buffer, valid until the next fill. requests: the constrained requests
        in row order; rows: their sampled rows (with drafts[i], len(drafts[i]) + 1 rows for
        requests[i]: its draft positions)."""
        if self._bitmask is None:
            # Pinned once: allocating pinned memory in a step would synchronize the device.
            pinned = allocate_bitmask(self.max_num_seqs, self.vocab_size, self.pin_memory)
            self._bitmask = pinned.numpy()  # a view: the memory stays pinned
        n = len(rows)
        # Safe to overwrite: a constrained step's fill waits for the step before it (its
        # tokens advance the matchers), so that step's copy of this buffer is done.
        bitmask = self._bitmask[:n]
        backend = self.backend
        if drafts is None:  # the usual step, kept to one pass: a row a request
            plain = matcher_rows(requests)
            first_rows: Sequence[int] = range(n)
            if len(plain) < n:
                _allow_all_failed(requests, bitmask, first_rows, repeat(()))
        else:
            plain, first_rows = _fill_drafted(requests, drafts, bitmask)
        backend.fill_bitmasks(plain, bitmask)
        if any(request.ignore_eos for request in requests):
            drop_eos(bitmask, _ignore_eos_rows(requests, first_rows, drafts), backend.eos_token_ids)
        unforced = unforced_rows(bitmask, *self._byte_words)
        if drafts is not None:  # each request's flag is its first row's
            unforced = [unforced[first] for first in first_rows]
        for request, forces_nothing in zip(requests, unforced):
            request.forces_nothing = forces_nothing
        return bitmask


def _ignore_eos_rows(
    requests: Sequence[StructuredOutputRequest],
    first_rows: Sequence[int],
    drafts: Sequence[Sequence[int]] | None,
) -> list[int]:
    """The rows of the requests that ignore EOS (all of a drafting request's rows)."""
    rows: list[int] = []
    for k, (request, first) in enumerate(zip(requests, first_rows)):
        if request.ignore_eos and not request.failed:
            rows.extend(range(first, first + 1 + (len(drafts[k]) if drafts else 0)))
    return rows


def _allow_all_failed(
    requests: Sequence[StructuredOutputRequest],
    bitmask: np.ndarray,
    first_rows: Sequence[int],
    drafts: Iterable[Sequence[int]],
) -> None:
    """A request failed by the step applied just before this fill: its rows are dropped, any
    mask serves (all tokens, so that sampling them stays well defined)."""
    for request, row, draft in zip(requests, first_rows, drafts):
        if request.failed:
            bitmask[row : row + 1 + len(draft)] = -1


def _fill_drafted(
    requests: Sequence[StructuredOutputRequest],
    drafts: Sequence[Sequence[int]],
    bitmask: np.ndarray,
) -> tuple[list[tuple[GrammarMatcher, int]], list[int]]:
    """Fills the draft positions' rows (and the failed requests'); returns the (matcher, row)
    of the rows without drafts, left to the backend's batch, and each request's first row."""
    plain, first_rows, row = [], [], 0
    for request, draft in zip(requests, drafts):
        first_rows.append(row)
        if draft and not request.failed:
            fill_draft_positions(request.matcher, draft, bitmask, row)
        elif not request.failed:
            plain.append((request.matcher, row))
        row += 1 + len(draft)
    _allow_all_failed(requests, bitmask, first_rows, drafts)
    return plain, first_rows


def fill_draft_positions(
    matcher: GrammarMatcher, draft: Sequence[int], bitmask: np.ndarray, row: int
) -> None:
    """The masks of a request's draft positions, rows row .. row + len(draft): at its last
    token, then after each draft token (taken on trial and rolled back). Past a draft token
    the grammar rejects, the rows repeat the last mask (the target's own token there differs
    from the draft, so verification stops before them)."""
    num_taken = 0
    for j in range(len(draft) + 1):
        if j == num_taken:
            matcher.fill_bitmask(bitmask, row + j)
        else:
            bitmask[row + j] = bitmask[row + j - 1]
        if j < len(draft) and j == num_taken and matcher.accept_tokens([draft[j]]):
            num_taken += 1
    matcher.rollback(num_taken)


class _LazyBackend:
    """The manager's backend for a request made before it was built: a request asks it
    for a matcher only once its grammar is compiled, so after the build."""

    def __init__(self, manager: StructuredOutputManager) -> None:
        self._manager = manager

    def new_matcher(self, grammar: CompiledGrammar) -> GrammarMatcher:
        return self._manager.backend.new_matcher(grammar)


def _build_compiler(
    future: Future[GrammarCompiler], tokenizer: str, vocab_size: int, cache_bytes: int
) -> None:
    try:
        future.set_result(shared_compiler(tokenizer, vocab_size, cache_bytes))
    except Exception as e:  # noqa: BLE001 - every request waiting on it fails with it
        future.set_exception(ValueError(f"the structured output backend could not be built: {e}"))


def _chain(
    built: Future[GrammarCompiler], spec: StructuredOutputSpec, grammar: Future[CompiledGrammar]
) -> None:
    """Once the compiler is built: grammar follows its compile of spec."""
    if built.exception() is not None:
        grammar.set_exception(built.exception())
        return
    compiled = built.result().submit(spec)

    def settle(done: Future[CompiledGrammar]) -> None:
        if done.exception() is not None:
            grammar.set_exception(done.exception())
        else:
            grammar.set_result(done.result())

    compiled.add_done_callback(settle)
