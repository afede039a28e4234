"""The grammar-engine boundary: a backend compiles a spec once and makes one matcher per
request from it; a matcher follows one request's tokens and fills its bitmask row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from minivllm.structured_output.params import StructuredOutputSpec


class CompiledGrammar(Protocol):
    """A compiled spec, shared read-only by every request that asks for it (the cache
    holds it): making a matcher from it must not change it."""

    @property
    def spec(self) -> StructuredOutputSpec: ...


class GrammarMatcher(Protocol):
    """One request's position in its grammar. Token ids are the tokenizer's; the bitmask
    layout is bitmask.py's (row of `num_words` int32 words, bit set = allowed).

    Invariant: the mask allows an EOS id iff is_accepting() (or is_finished(), where EOS
    is the only allowed token), so EOS can end the output only where the grammar accepts.
    """

    def accept_tokens(self, token_ids: Sequence[int]) -> bool:
        """Consumes all of token_ids and returns True, or returns False: the grammar
        rejects one of them (the matcher stays where it was), or the matcher failed
        (error() says why)."""
        ...

    def validate_tokens(self, token_ids: Sequence[int]) -> int:
        """How many leading token_ids the grammar would accept, consuming none (once it is
        finished: one EOS)."""
        ...

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        """Writes the next token's mask into bitmask[row] (host int32 words: a numpy array,
        or a CPU tensor, which numpy reads in place)."""
        ...

    def forced_tokens(self) -> list[int]:
        """Tokens that spell what the grammar admits as its only continuation from here
        (JSON keys, punctuation), consuming none; may be empty."""
        ...

    def rollback(self, num_tokens: int) -> None:
        """Undoes the last num_tokens accepted tokens; more than were accepted is a
        ValueError."""
        ...

    def reset(self) -> None:
        """Back to the start of the grammar, as if no token were accepted."""
        ...

    def is_accepting(self) -> bool:
        """The tokens so far form a complete output (EOS is allowed now)."""
        ...

    def is_finished(self) -> bool:
        """The grammar can take nothing more but EOS, or it has taken EOS: the output is
        done (finish reason 'stop')."""
        ...

    def error(self) -> str | None:
        """Why the matcher can go no further (a resource limit of the engine hit while
        matching), or None; the request must then fail with this message."""
        ...


class StructuredOutputBackend(Protocol):
    """One grammar engine over one tokenizer, built once per engine."""

    @property
    def vocab_size(self) -> int:
        """The tokenizer's vocabulary size; a bitmask row covers ids [0, vocab_size)."""
        ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    @property
    def byte_token_ids(self) -> tuple[int, ...]:
        """At most one token per byte value: a non-special token that is exactly that one
        byte. A mask allowing two of them allows two next bytes: the grammar forces nothing
        there (bitmask.unforced_rows)."""
        ...

    def compile(self, spec: StructuredOutputSpec) -> CompiledGrammar:
        """Compiles a spec; thread-safe (the compiler calls it from its pool). A spec the
        engine cannot honour (bad schema or regex, unsupported feature, grammar syntax
        error) is a ValueError whose message names the problem."""
        ...

    def new_matcher(self, grammar: CompiledGrammar) -> GrammarMatcher:
        """A matcher at the start of the grammar, for one request; cheap."""
        ...

    def grammar_bytes(self, grammar: CompiledGrammar) -> int:
        """An upper estimate of the memory a compiled grammar holds while cached (the
        compiler's cache is bounded by the sum)."""
        ...

    def fill_bitmasks(
        self, rows: Sequence[tuple[GrammarMatcher, int]], bitmask: np.ndarray
    ) -> None:
        """Fills bitmask[row] for each (matcher, row) of this backend, in parallel where
        the engine can; bitmask: CPU int32 [num_rows, num_words], C-contiguous."""
        ...

    def accept_token_batch(self, pairs: Sequence[tuple[GrammarMatcher, int]]) -> list[bool]:
        """accept_tokens([token_id]) for each (matcher, token_id) of this backend, in parallel
        where the engine can; one result per pair, in order. Unlike accept_tokens, a rejected
        token may leave its matcher failed (error() then says why) rather than where it was:
        the caller ends that request. This default advances them one by one."""
        return [matcher.accept_tokens([token_id]) for matcher, token_id in pairs]
