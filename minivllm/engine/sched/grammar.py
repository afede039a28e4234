"""The scheduler's structured-output steps: which waiting request's grammar is ready, the
constrained rows of a step, and the matcher's advance on each sampled token."""

from __future__ import annotations

from collections import deque

from minivllm.engine.sched.request import Request, RequestStatus
from minivllm.engine.types import ScheduledChunk
from minivllm.structured_output.manager import StepBitmask, StructuredOutputManager
from minivllm.structured_output.request_state import GrammarViolation


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


def step_bitmask(
    chunks: list[ScheduledChunk], requests: dict[str, Request], manager: StructuredOutputManager
) -> StepBitmask | None:
    """The constrained rows among the step's sampled rows (chunks with sample=True, in
    order), or None when there are none."""
    constrained, rows = [], []
    row = 0
    for chunk in chunks:
        if not chunk.sample:
            continue
        so = requests[chunk.req_id].structured_output
        if so is not None:
            constrained.append(so)
            rows.append(row)
        row += 1
    return StepBitmask(constrained, rows, manager) if constrained else None


def advance_grammar(request: Request) -> bool:
    """Feeds the request's last output token to its matcher; returns whether that ended the
    request: the grammar's end (finish reason 'stop', also before min_tokens: nothing else
    can follow) or a failed matcher ('error')."""
    so = request.structured_output
    assert so is not None
    try:
        ended = so.advance(request.output_token_ids[-1:]) == "stop"
    except GrammarViolation as e:
        fail_request(request, str(e))
        return True
    if ended:
        request.status = RequestStatus.FINISHED_STOPPED
        request.finish_reason = "stop"
    return ended
