"""StructuredOutputRequest: what the engine keeps per constrained request: its compile
future, then its matcher and the output tokens the matcher has accepted; and the advance of
many requests by one token each in one batched call."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Literal

import numpy as np

from minivllm.structured_output.backend import (
    CompiledGrammar,
    GrammarMatcher,
    StructuredOutputBackend,
)
from minivllm.structured_output.compiler import compile_result
from minivllm.structured_output.params import StructuredOutputSpec


class GrammarViolation(RuntimeError):
    """The request's output cannot follow its grammar: a token the mask should have
    excluded (a bug upstream), or the matcher failed (a resource limit of the engine)."""


# One token's advance: the grammar ended ("stop"), goes on (None), or failed the request.
AdvanceOutcome = Literal["stop"] | GrammarViolation | None


class StructuredOutputRequest:
    """One request's grammar state.

    Not ready until its compile future is done (the scheduler keeps it waiting meanwhile).
    Then accepted_token_ids is the prefix of the request's output that the matcher has
    consumed; rollback() and sync() move it, for preemption, async placeholders and
    rejected draft tokens.
    """

    def __init__(
        self,
        spec: StructuredOutputSpec,
        grammar: Future[CompiledGrammar],
        backend: StructuredOutputBackend,
        ignore_eos: bool = False,
    ) -> None:
        self.spec = spec
        # The request's ignore_eos: its masks drop EOS wherever the grammar allows more than
        # EOS, so that an accepting state does not end it (EOS still ends a grammar that ended).
        self.ignore_eos = ignore_eos
        self._grammar = grammar
        self._backend = backend
        self._matcher: GrammarMatcher | None = None
        self.accepted_token_ids: list[int] = []
        # An advance failed the request (GrammarViolation): its matcher takes nothing more.
        self.failed = False
        # Its last mask showed the grammar forcing nothing (bitmask.unforced_rows: two next
        # bytes, or free text): the scheduler does not look up forced tokens for it.
        self.forces_nothing = False

    def is_ready(self) -> bool:
        """True once the grammar is compiled and the request's matcher made; a ValueError
        (the compile's: a bad spec, a timeout; or the backend failing to make the matcher)
        fails this request alone."""
        if self._matcher is None:
            if not self._grammar.done():
                return False
            grammar = compile_result(self._grammar)
            try:
                self._matcher = self._backend.new_matcher(grammar)
            except Exception as e:  # noqa: BLE001 - the request fails, not the engine
                raise ValueError(
                    f"the {self.spec.kind} grammar's matcher could not be made: "
                    f"{type(e).__name__}: {e}"
                ) from e
        return True

    @property
    def compile(self) -> Future[CompiledGrammar]:
        """The grammar's compile: done once it is ready or has failed."""
        return self._grammar

    @property
    def matcher(self) -> GrammarMatcher:
        if self._matcher is None:
            raise RuntimeError("the structured output grammar is not compiled yet")
        return self._matcher

    @property
    def num_accepted_tokens(self) -> int:
        return len(self.accepted_token_ids)

    def is_finished(self) -> bool:
        return self.matcher.is_finished()

    def advance(self, new_token_ids: Sequence[int]) -> Literal["stop"] | None:
        """Feeds newly sampled output tokens to the matcher; "stop" once the grammar has
        ended (it takes nothing more, or took EOS): the request finishes with reason
        'stop'. A disallowed token or a failed matcher raises GrammarViolation (the
        request fails); the allowed tokens before a disallowed one are kept."""
        new_token_ids = list(new_token_ids)
        if not self.matcher.accept_tokens(new_token_ids):
            self.failed = True
            num_valid = 0
            if self.matcher.error() is None:  # a rejected token: keep the allowed ones before it
                num_valid = self.matcher.validate_tokens(new_token_ids)
                self._accept(new_token_ids[:num_valid])
            raise self._violation(new_token_ids[num_valid])
        self.accepted_token_ids.extend(new_token_ids)
        return "stop" if self.matcher.is_finished() else None

    def rollback(self, num_tokens: int) -> None:
        """Forgets the last num_tokens accepted tokens (ValueError if more than accepted)."""
        self.matcher.rollback(num_tokens)
        del self.accepted_token_ids[len(self.accepted_token_ids) - num_tokens :]

    def sync(self, output_token_ids: Sequence[int]) -> Literal["stop"] | None:
        """Makes the matcher's state that of having accepted exactly output_token_ids:
        rolls back to the common prefix, then advances by the rest."""
        common = 0
        limit = min(len(output_token_ids), self.num_accepted_tokens)
        while common < limit and output_token_ids[common] == self.accepted_token_ids[common]:
            common += 1
        self.rollback(self.num_accepted_tokens - common)
        return self.advance(output_token_ids[common:])

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        self.matcher.fill_bitmask(bitmask, row)

    def _violation(self, token_id: int) -> GrammarViolation:
        """Why the matcher did not take token_id, the output token after the accepted ones."""
        error = self.matcher.error()
        if error is not None:
            return GrammarViolation(f"the {self.spec.kind} grammar failed: {error}")
        return GrammarViolation(
            f"output token {token_id} at position {self.num_accepted_tokens} is not allowed "
            f"by the {self.spec.kind} grammar"
        )

    def _accept(self, token_ids: list[int]) -> None:
        if not self.matcher.accept_tokens(token_ids):
            raise GrammarViolation("the matcher rejected tokens it had validated")
        self.accepted_token_ids.extend(token_ids)


def matcher_rows(
    requests: Sequence[StructuredOutputRequest],
) -> list[tuple[GrammarMatcher, int]]:
    """(matcher, k) for each requests[k] that has not failed (requests: ready), in order: a
    step's one-row-a-request mask fill. The matchers are read directly, not through the
    property (which checks readiness): this runs over every constrained request each step."""
    return [(r._matcher, k) for k, r in enumerate(requests) if not r.failed]


def advance_batch(
    backend: StructuredOutputBackend,
    requests: Sequence[StructuredOutputRequest],
    token_ids: Sequence[int],
) -> list[AdvanceOutcome]:
    """requests[k].advance([token_ids[k]]) for every k, in one backend.accept_token_batch call
    (requests: ready, with matchers of backend): per request "stop", None, or the
    GrammarViolation that advance would raise, which fails that request alone (its matcher
    may be left failed)."""
    # Ready requests (the contract): their matchers read directly, not through the property
    # (which checks readiness), since this runs over every constrained request each step.
    matchers = [request._matcher for request in requests]
    accepted = backend.accept_token_batch(list(zip(matchers, token_ids)))
    outcomes: list[AdvanceOutcome] = []
    for request, matcher, token_id, ok in zip(requests, matchers, token_ids, accepted):
        if ok:
            request.accepted_token_ids.append(token_id)
            outcomes.append("stop" if matcher.is_finished() else None)
        else:
            request.failed = True
            outcomes.append(request._violation(token_id))
    return outcomes
