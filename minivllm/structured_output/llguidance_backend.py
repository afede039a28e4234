"""The llguidance backend: specs become llguidance grammars, compiled into template
LLMatchers ("lanes") that requests deep-copy in turn; a step's masks are filled by
llguidance's thread pool, and its tokens consumed there too at large batch.

Why lanes: an LLMatcher's deep copy shares its template's lexer state (the lazily built
DFA) behind one mutex, so the copies of one template take turns in the thread pool, however
many threads it has. A grammar that a second request asks for (shared: the usual case at
large batch) gets one independently built template per pool thread, built in the
background, so that its requests are matched in parallel; a grammar used once keeps the
one its compile built and costs no more."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

import llguidance
import llguidance.hf
import numpy as np

from minivllm.structured_output.grammar_probe import probe_error, probe_token_ids
from minivllm.structured_output.grammar_text import grammar_text
from minivllm.structured_output.params import StructuredOutputSpec

# The oldest llguidance whose API this backend uses (LLTokenizer.eos_tokens, ...); pyproject's
# pin says the same (a test keeps the two equal).
MIN_LLGUIDANCE = (1, 9)


# A step's advance goes to llguidance's pool from this many rows on, with a pool of at least
# this many threads: fewer tokens advance faster one by one on the caller's thread than the
# pool wakes (a token's advance costs microseconds; docs/performance.md has the figures).
PARALLEL_ADVANCE_MIN_ROWS = 16
PARALLEL_ADVANCE_MIN_THREADS = 4


# A spec's text past this many bytes is refused before it compiles: compile time grows with
# the schema (a 147 kB schema of 4,000 properties builds in ~1.4 s on one core, a 370 kB one
# of 10,000 in 17-30 s), and a thread that compiles cannot be stopped.
MAX_SPEC_BYTES = 256 << 10

# grammar_bytes' estimate of one lane (template): an upper bound of the resident memory that
# distinct compiles added on the demo model's 49k vocabulary
# (benchmarks/cpu/bench_grammar_memory_cpu.py: 15-240 bytes a character of grammar text for JSON
# schemas of 5-450 properties, at most ~50 kB for a small regex, by the tokenizer's build).
LANE_BYTES_BASE = 64 << 10
LANE_BYTES_PER_CHAR = 256


def check_llguidance_version(installed: str) -> None:
    """RuntimeError naming both versions when `installed` is older than MIN_LLGUIDANCE (an
    environment that also holds a package pinning an older one, e.g. vLLM 0.20's 1.3)."""
    numbers = tuple(int(part) for part in re.findall(r"\d+", installed)[:2])
    if numbers < MIN_LLGUIDANCE:
        wanted = ".".join(map(str, MIN_LLGUIDANCE))
        raise RuntimeError(
            f"structured outputs need llguidance >= {wanted}, but {installed} is installed "
            f"(pip install 'llguidance>={wanted}')"
        )


def _host_words(bitmask: np.ndarray) -> np.ndarray:
    """The bitmask llguidance writes through a raw pointer: int32 words, on the host, one
    contiguous block (anything else would be written out of bounds). A CPU tensor is read in
    place, as a numpy array."""
    try:
        words = np.asarray(bitmask)
    except (TypeError, RuntimeError) as e:  # a device tensor has no host memory
        raise ValueError(f"the grammar bitmask must be a contiguous int32 host tensor: {e}") from e
    if words.dtype != np.int32 or not words.flags.c_contiguous or not words.flags.writeable:
        raise ValueError(
            f"the grammar bitmask must be a contiguous int32 host tensor, got {words.dtype} "
            f"(contiguous={words.flags.c_contiguous}, writeable={words.flags.writeable})"
        )
    return words


def default_num_threads() -> int:
    """llguidance's own default pool size: 80 % of the usable cores, 1 to 32."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(32, max(1, (cores or 1) * 80 // 100))


@dataclass(frozen=True, eq=False)
class LLGuidanceGrammar:
    spec: StructuredOutputSpec
    text: str  # llguidance's grammar, which every lane is built from
    # Templates at the start, never advanced, each with a lexer state of its own: the
    # compile's, then those the backend adds (appended from its threads; never removed).
    lanes: list[llguidance.LLMatcher]
    turn: itertools.count = field(default_factory=itertools.count)


class LLGuidanceMatcher:
    """A GrammarMatcher over one llguidance LLMatcher (see backend.GrammarMatcher)."""

    def __init__(self, matcher: llguidance.LLMatcher, eos_token_ids: tuple[int, ...]) -> None:
        self.matcher = matcher
        self._eos_token_ids = frozenset(eos_token_ids)
        # The accepted tokens: those llguidance consumed, then those only checked (an EOS
        # taken after the grammar stopped, which llguidance would not roll back). Checked
        # ones only ever follow consumed ones: a stopped matcher consumes nothing more.
        self._num_consumed = 0
        self._num_checked = 0

    def accept_tokens(self, token_ids: Sequence[int]) -> bool:
        token_ids = list(token_ids)
        if self.matcher.is_error() or self.validate_tokens(token_ids) < len(token_ids):
            return False
        return all(self._take(token_id) for token_id in token_ids)

    def take_sampled(self, token_id: int) -> bool:
        """accept_tokens([token_id]) for a token sampled under this matcher's mask, without
        validating it first (a step's advance): a rejected token fails the matcher."""
        if self.matcher.is_stopped():  # an EOS after the stop is checked, not consumed
            return self.accept_tokens([token_id])
        return self._consume(token_id)

    def _take(self, token_id: int) -> bool:
        """Takes a validated token, counted as accept_tokens does: an EOS after the stop is
        checked, anything else consumed."""
        if self.matcher.is_stopped():
            self._num_checked += 1
            return True
        return self._consume(token_id)

    def _consume(self, token_id: int) -> bool:
        """llguidance consumes the token (its matcher not stopped), counted; False where it
        refuses it (error() says why)."""
        return self.count_consumed(self.matcher.consume_token(token_id))

    def count_consumed(self, consumed: bool) -> bool:
        """Counts one token llguidance has consumed (consumed: its answer); returns it."""
        self._num_consumed += consumed
        return consumed

    def validate_tokens(self, token_ids: Sequence[int]) -> int:
        token_ids = list(token_ids)
        if self.matcher.is_stopped():  # llguidance validates nothing here, not even EOS
            return int(bool(token_ids) and token_ids[0] in self._eos_token_ids)
        return self.matcher.validate_tokens(token_ids)

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        # llguidance.torch has the same call, but importing it compiles a torch function
        # (torch._dynamo: ~1.5 s at every process start); the raw pointer call is all it does.
        words = _host_words(bitmask)[row]
        self.matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)

    def forced_tokens(self) -> list[int]:
        if self.matcher.is_stopped():  # also true of a failed matcher
            return []
        return self.matcher.compute_ff_tokens()

    def rollback(self, num_tokens: int) -> None:
        num_accepted = self._num_consumed + self._num_checked
        if not 0 <= num_tokens <= num_accepted:
            raise ValueError(f"cannot roll back {num_tokens} tokens: {num_accepted} were accepted")
        if num_tokens == 0:
            return
        num_checked = min(num_tokens, self._num_checked)  # the last ones accepted
        self._num_checked -= num_checked
        self._num_consumed -= num_tokens - num_checked
        if not self.matcher.rollback(num_tokens - num_checked):
            raise RuntimeError(f"llguidance rollback failed: {self.matcher.get_error()}")

    def reset(self) -> None:
        self.rollback(self._num_consumed + self._num_checked)

    def is_accepting(self) -> bool:
        return self.matcher.is_accepting()

    def is_finished(self) -> bool:
        return self.matcher.is_stopped() and not self.matcher.is_error()

    def error(self) -> str | None:
        return self.matcher.get_error() or None


class LLGuidanceBackend:
    """A StructuredOutputBackend over llguidance, for one HF fast tokenizer.

    vocab_size: the tokenizer's (default) or larger, e.g. the model's padded vocabulary;
    num_threads: llguidance's pool (masks, large advances), and the lanes of each grammar (None:
    llguidance's default); limits: its parser limits, which bound the work of one compile
    or one mask (None: its defaults, with errors that do not dump the parser state).
    """

    def __init__(
        self,
        hf_tokenizer: Any,
        *,
        vocab_size: int | None = None,
        num_threads: int | None = None,
        limits: llguidance.LLParserLimits | None = None,
    ) -> None:
        check_llguidance_version(version("llguidance"))
        # Expensive (about a second for a 150k vocabulary): once per engine.
        self.tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size)
        self.num_threads = num_threads or default_num_threads()
        self._executor = llguidance.LLExecutor(self.num_threads)
        # Builds shared grammars' lanes side by side (llguidance drops the GIL while it builds).
        self._lane_builder = ThreadPoolExecutor(
            max(1, self.num_threads - 1), "minivllm-grammar-lane"
        )
        self._limits = limits or llguidance.LLParserLimits(verbose_errors=False)
        self.byte_token_ids = byte_token_ids(self.tokenizer)
        self._probe_tokens = probe_token_ids(self.tokenizer)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return tuple(self.tokenizer.eos_tokens)

    def compile(self, spec: StructuredOutputSpec) -> LLGuidanceGrammar:
        num_bytes = len(spec.text.encode())
        if num_bytes > MAX_SPEC_BYTES:
            raise ValueError(
                f"the structured output {spec.kind} is {num_bytes:,} bytes, more than the "
                f"grammar engine's limit of {MAX_SPEC_BYTES:,} bytes (MAX_SPEC_BYTES)"
            )
        text = grammar_text(spec)
        template = self._template(text)
        if template.is_error():
            raise ValueError(f"invalid structured output {spec.kind}: {template.get_error()}")
        error = probe_error(template, self._probe_tokens)
        if error is not None:
            raise ValueError(
                f"the structured output {spec.kind} is beyond the grammar engine's limits "
                f"(llguidance: {error.removesuffix('<non-verbose/>').strip()})"
            )
        return LLGuidanceGrammar(spec, text, [template])

    def new_matcher(self, grammar: LLGuidanceGrammar) -> LLGuidanceMatcher:
        turn = next(grammar.turn)
        if turn == 1:  # a second request: the grammar is shared, give it its lanes
            for _ in range(1, self.num_threads):
                self._lane_builder.submit(self._add_lane, grammar)
        lanes = grammar.lanes  # those built so far
        return LLGuidanceMatcher(lanes[turn % len(lanes)].deep_copy(), self.eos_token_ids)

    def grammar_bytes(self, grammar: LLGuidanceGrammar) -> int:
        """Lanes x an estimate of one lane (LANE_BYTES_*): the lanes a shared grammar will
        have (num_threads), whether built yet or not."""
        return self.num_threads * (LANE_BYTES_BASE + LANE_BYTES_PER_CHAR * len(grammar.text))

    def _add_lane(self, grammar: LLGuidanceGrammar) -> None:
        template = self._template(grammar.text)
        if not template.is_error():  # it compiled once: it does again
            grammar.lanes.append(template)

    def _template(self, text: str) -> llguidance.LLMatcher:
        # Building the matcher builds the lexer (the costly part; llguidance drops the GIL)
        # and reports every grammar error; it never raises for them.
        template = llguidance.LLMatcher(self.tokenizer, text, log_level=0, limits=self._limits)
        # The first mask builds lexer states that deep copies share: build them here, off the
        # engine's thread, not at a request's first step (ms for a schema).
        template.compute_bitmask()
        return template

    def fill_bitmasks(
        self, rows: Sequence[tuple[LLGuidanceMatcher, int]], bitmask: np.ndarray
    ) -> None:
        if rows:
            pairs = [(m.matcher, row) for m, row in rows]
            host = _host_words(bitmask)
            batch, words = host.shape
            self._executor.unsafe_compute_mask_ptr(pairs, host.ctypes.data, words * 4, batch)

    def accept_token_batch(self, pairs: Sequence[tuple[LLGuidanceMatcher, int]]) -> list[bool]:
        pool_pays = self.num_threads >= PARALLEL_ADVANCE_MIN_THREADS
        if len(pairs) < PARALLEL_ADVANCE_MIN_ROWS or not pool_pays:
            # One by one on the caller's thread: for a few tokens, less than waking the pool.
            return [m.take_sampled(token_id) for m, token_id in pairs]
        # llguidance's pool consumes the running matchers' tokens side by side; a stopped
        # matcher's token (an EOS after the stop) goes through take_sampled, which checks it.
        stopped = [m.matcher.is_stopped() for m, _ in pairs]
        running = [(m.matcher, t) for (m, t), done in zip(pairs, stopped) if not done]
        consumed = iter(self._executor.consume_token_par(running))
        return [
            m.take_sampled(token_id) if done else m.count_consumed(next(consumed))
            for (m, token_id), done in zip(pairs, stopped)
        ]


def byte_token_ids(tokenizer: llguidance.LLTokenizer) -> tuple[int, ...]:
    """The first non-special token of each one-byte spelling (see
    StructuredOutputBackend.byte_token_ids): a pass over the vocabulary, once per backend."""
    first: dict[bytes, int] = {}
    for token_id in range(tokenizer.vocab_size):
        if not tokenizer.is_special_token(token_id):
            spelling = tokenizer.decode_bytes([token_id])
            if len(spelling) == 1:
                first.setdefault(spelling, token_id)
    return tuple(first.values())
