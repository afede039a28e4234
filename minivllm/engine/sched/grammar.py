"""The scheduler's structured-output steps: which waiting request's grammar is ready, the
constrained rows of a step and their masks (the step's grammar output), and the matchers'
advance on the sampled tokens (one batched call a step)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from minivllm.engine.sched.request import Request, RequestStatus, draft_room
from minivllm.engine.types import GrammarOutput, RunnerOutput, ScheduledChunk
from minivllm.structured_output.backend import StructuredOutputBackend
from minivllm.structured_output.params import StructuredOutputsParams
from minivllm.structured_output.request_state import (
    AdvanceOutcome,
    GrammarViolation,
    StructuredOutputRequest,
    advance_batch,
)

# The most forced tokens one step appends for a request (jump-forward).
MAX_FORCED_TOKENS = 16


class GrammarMasks(Protocol):
    """What the scheduler asks of the engine's grammar state (structured_output/manager.py's
    StructuredOutputManager, built by the engine and handed in)."""

    @property
    def backend(self) -> StructuredOutputBackend: ...

    def new_request(
        self, params: StructuredOutputsParams, ignore_eos: bool = False
    ) -> StructuredOutputRequest: ...

    def fill(
        self,
        requests: Sequence[StructuredOutputRequest],
        rows: Sequence[int],
        drafts: Sequence[Sequence[int]] | None = None,
    ) -> np.ndarray: ...


def fail_request(request: Request, error: str) -> None:
    """Marks request finished with an error (it fails alone; the caller releases it)."""
    request.status = RequestStatus.FINISHED_ERROR
    request.finish_reason = "error"
    request.error = error


def first_admissible(waiting: deque[Request], failed: list[Request]) -> Request | None:
    """The first waiting request that can be admitted now: one whose grammar is still
    compiling waits without holding up those behind it; one whose compile failed leaves
    `waiting` for `failed`. None at a request with a token in flight (preempted while its
    step ran): it goes first once update() has that token."""
    admissible = None
    for request in waiting:  # stops at the first admissible one: no copy of the queue
        if request.num_pending_tokens:
            break
        so = request.structured_output
        try:
            if so is None or so.is_ready():
                admissible = request
                break
        except ValueError as e:  # the compile failed or timed out
            fail_request(request, str(e))
            failed.append(request)
    for request in failed:
        waiting.remove(request)
    return admissible


def wait_for_compiles(waiting: deque[Request], timeout: float) -> None:
    """Returns once some waiting request's grammar compile has ended, or after timeout
    seconds (at once when none compiles)."""
    compiling = [
        r.structured_output.compile
        for r in waiting
        if r.structured_output is not None and not r.structured_output.compile.done()
    ]
    if compiling:
        wait(compiling, timeout, return_when=FIRST_COMPLETED)


@dataclass
class GrammarRows:
    """The constrained rows among a step's sampled rows, before their masks are filled."""

    requests: list[StructuredOutputRequest]
    rows: list[int]  # each request's row, or with drafts one row per position
    drafts: list[Sequence[int]] | None  # each request's draft tokens; None: no drafts


def constrained_rows(
    chunks: list[ScheduledChunk], requests: dict[str, Request]
) -> GrammarRows | None:
    """The constrained rows among the step's sampled rows (chunks with sample=True, in
    order; a chunk with drafts has a row per position), or None when there are none."""
    constrained, rows, drafts = [], [], []
    any_drafts = False
    row = 0
    for chunk in chunks:
        if not chunk.sample:
            continue
        num_drafts = chunk.num_draft_tokens
        so = requests[chunk.req_id].structured_output
        if so is not None:
            constrained.append(so)
            if num_drafts:
                rows += range(row, row + 1 + num_drafts)
                drafts.append(chunk.token_ids[-num_drafts:])
                any_drafts = True
            else:  # the usual row, kept cheap: this loop runs over every request each step
                rows.append(row)
                drafts.append(())
        row += 1 + num_drafts
    if not constrained:
        return None
    return GrammarRows(constrained, rows, drafts if any_drafts else None)


def fill_masks(rows: GrammarRows, manager: GrammarMasks) -> GrammarOutput:
    """The rows' masks, filled by their matchers (which must have taken every token before
    the step): the step's grammar output."""
    bitmask = manager.fill(rows.requests, rows.rows, rows.drafts)
    return GrammarOutput(rows.rows, bitmask)


def forced_drafts(requests: list[Request], max_model_len: int) -> dict[str, list[int]]:
    """req_id -> the tokens its grammar forces next (jump-forward: JSON keys, punctuation),
    as drafts, for the decode-ready constrained requests among `requests`. Verified like any
    draft, each under its own position's mask, so the output is what decoding token by token
    gives; capped like speculative drafts by max_tokens and max_model_len.

    A request whose last token is still in flight (async scheduling) drafts after it: its
    matcher stands before that token, so the first forced token is the guess of it and the
    rest are the drafts. A wrong guess costs only rejected drafts (the mask of each draft
    position follows the real token: it is filled once the step in flight is applied). A
    request whose drafts are in flight sits this step out (the scheduler's rule); the
    other requests are scheduled ahead as usual.

    A request whose last mask showed its grammar forcing nothing (two possible next bytes,
    such as JSON's optional whitespace, or free text: bitmask.unforced_rows) is not looked
    up: the lookup is the costly part at large batch. Its first forced run after such a
    state then starts a step later; the output is the same."""
    out = {}
    for request in requests:
        so = request.structured_output
        if so is None or so.forces_nothing:  # so its mask showed a step ago
            continue
        # No room (drafts in flight, max_tokens or max_model_len reached): no lookup, the
        # costly part.
        room = draft_room(request, MAX_FORCED_TOKENS, max_model_len, after_pending=True)
        if not room:
            continue
        forced = so.matcher.forced_tokens()
        pending = request.num_pending_tokens
        if len(forced) > pending:
            out[request.req_id] = forced[pending : pending + room]
    return out


def advance_grammars(
    requests: dict[str, Request], runner_out: RunnerOutput, manager: GrammarMasks
) -> dict[str, AdvanceOutcome]:
    """The step's grammar advance in one batched call, before update() appends the tokens:
    each live constrained request whose sampled row brings one new token (no accepted
    drafts) feeds it to its matcher. Returns req_id -> outcome, which end_grammar() applies
    at that token; a request with several new tokens is left to advance_grammar."""
    # One pass over the step's rows: this runs over every constrained request each step.
    req_ids: list[str] = []
    states: list[StructuredOutputRequest] = []
    token_ids: list[int] = []
    get = requests.get
    num_accepted = runner_out.num_accepted_drafts
    rows = zip(runner_out.req_ids, runner_out.sampled_token_ids)
    if num_accepted is not None:  # rows with accepted drafts are advance_grammar's
        rows = (row for row, accepted in zip(rows, num_accepted) if not accepted)
    for req_id, token_id in rows:
        request = get(req_id)
        if request is None or request.finish_reason is not None:
            continue  # aborted, or finished by the step before: update() skips it too
        so = request.structured_output
        if so is not None:
            req_ids.append(req_id)
            states.append(so)
            token_ids.append(token_id)
    if not states:
        return {}
    return dict(zip(req_ids, advance_batch(manager.backend, states, token_ids)))


# end_grammar's mark of a request that advance_grammars did not advance.
_NOT_ADVANCED = object()


def end_grammar(request: Request, advanced: dict[str, AdvanceOutcome]) -> bool:
    """advance_grammar(request), or the outcome advance_grammars took for its token (used
    once: popped). Runs for every constrained request each step: one dict operation, and
    the usual outcome (None: the grammar goes on) tested first."""
    outcome = advanced.pop(request.req_id, _NOT_ADVANCED)
    if outcome is None:
        return False
    if outcome is _NOT_ADVANCED:
        return advance_grammar(request)
    return _apply(request, outcome)


def advance_grammar(request: Request) -> bool:
    """Feeds the request's last output token to its matcher; returns whether that ended the
    request: the grammar's end (finish reason 'stop', also before min_tokens: nothing else
    can follow) or a failed matcher ('error')."""
    so = request.structured_output
    assert so is not None
    try:
        outcome = so.advance(request.output_token_ids[-1:])
    except GrammarViolation as e:
        outcome = e
    return _apply(request, outcome)


def _apply(request: Request, outcome: AdvanceOutcome) -> bool:
    """Ends the request where its grammar's advance ended it; returns whether it did."""
    if isinstance(outcome, GrammarViolation):
        fail_request(request, str(outcome))
        return True
    if outcome == "stop":
        request.status = RequestStatus.FINISHED_STOPPED
        request.finish_reason = "stop"
        return True
    return False
