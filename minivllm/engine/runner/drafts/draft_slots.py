"""Draft slots filled at launch (async scheduling with speculative decoding).

The scheduler schedules a drafting request's step N + 1 while step N, which drafts for it, is
in flight. The request's chunk then holds placeholders: the token step N samples, then draft
slots for the drafts the proposer makes once step N's tokens are read; and where step N
verified drafts, the chunk's positions assume that all of them were accepted. At launch the
runner reads step N (its tokens, acceptance and proposals: StepHandle.result(), which the
scheduler's update() reads again later) and rewrites those chunks: the real token, positions
shifted back by step N's rejected drafts, as many drafts as the proposer made (at most the
slots). The blocks allocated for the assumed positions cover the real ones, which are never
later; the scheduler makes the same correction when it applies step N.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from minivllm.engine.runner.step_handle import StepHandle
from minivllm.engine.types import (
    PLACEHOLDER_TOKEN_ID,
    GrammarOutput,
    RunnerOutput,
    ScheduledChunk,
    SchedulerOutput,
)


@dataclass
class FilledStep:
    """A step as it runs: its chunks filled (or the step as scheduled, where none waited)."""

    sched_out: SchedulerOutput
    read_previous: bool = False  # whether filling read the step before (its result())
    # The scheduler's sampled rows -> the filled step's (sampled_row_map); None: the same.
    row_map: list[int] | None = None


class DraftSlotFiller:
    """The runner's memory of the step before, which a step's chunks may wait for: its draft
    slots as scheduled and its handle (kept only where the next step may wait for it)."""

    def __init__(self) -> None:
        self._last_handle: StepHandle | None = None
        self._last_draft_slots: dict[str, int] = {}

    def fill(self, sched_out: SchedulerOutput) -> FilledStep:
        """The step with the chunks that wait for the step before filled from its output,
        read now. Called once per step, before its launch."""
        prev_slots, self._last_draft_slots = self._last_draft_slots, draft_slots(sched_out)
        if not prev_slots and not any(c.num_draft_tokens for c in sched_out.chunks):
            return FilledStep(sched_out)  # the common step: nothing to fill
        if not needs_filling(sched_out, prev_slots):
            return FilledStep(sched_out)
        assert self._last_handle is not None
        filled = fill_draft_slots(sched_out, prev_slots, self._last_handle.result())
        return FilledStep(filled, True, sampled_row_map(sched_out, filled))

    def sampled(self, handle: StepHandle) -> None:
        """The step just filled was sampled: `handle` reads its output."""
        # Kept only where the next step's chunks may wait for it: it had draft slots (as
        # scheduled) or asked for drafts.
        self._last_handle = handle if handle.asked or self._last_draft_slots else None


def draft_slots(sched_out: SchedulerOutput) -> dict[str, int]:
    """req_id -> the draft slots the scheduler gave its chunk (before any filling): what it
    assumes accepted when it schedules the request's next step before this one is read."""
    return {c.req_id: c.num_draft_tokens for c in sched_out.chunks if c.num_draft_tokens}


def needs_filling(sched_out: SchedulerOutput, prev_slots: dict[str, int]) -> bool:
    """Whether a chunk waits for the step before: placeholder drafts, or positions that assume
    the step before accepted its drafts."""
    return any(_waits(c, prev_slots) for c in sched_out.chunks)


def _waits(chunk: ScheduledChunk, prev_slots: dict[str, int]) -> bool:
    token_ids = chunk.token_ids
    if token_ids[0] != PLACEHOLDER_TOKEN_ID:
        return False
    has_slots = chunk.num_draft_tokens and token_ids[-1] == PLACEHOLDER_TOKEN_ID
    return chunk.req_id in prev_slots or bool(has_slots)


def fill_draft_slots(
    sched_out: SchedulerOutput, prev_slots: dict[str, int], prev: RunnerOutput
) -> SchedulerOutput:
    """sched_out with every waiting chunk filled from the step before's output `prev` and the
    draft slots that step had (prev_slots)."""
    row = {req_id: i for i, req_id in enumerate(prev.req_ids)}
    chunks = [
        _filled(c, prev_slots, prev, row[c.req_id]) if _waits(c, prev_slots) else c
        for c in sched_out.chunks
    ]
    return replace(sched_out, chunks=chunks)


def _filled(
    chunk: ScheduledChunk, prev_slots: dict[str, int], prev: RunnerOutput, i: int
) -> ScheduledChunk:
    """chunk after its step-before row i: the sampled token first, the proposals in its
    draft slots, its positions moved back by the drafts that step rejected."""
    accepted = prev.num_accepted_drafts[i] if prev.num_accepted_drafts is not None else 0
    shift = prev_slots.get(chunk.req_id, 0) - accepted
    drafts = chunk.token_ids[1:]  # a chunk that waits starts with the pending token
    if drafts and drafts[-1] == PLACEHOLDER_TOKEN_ID:
        drafts = prev.draft_token_ids.get(chunk.req_id, [])[: len(drafts)]
    return replace(
        chunk,
        token_ids=[prev.sampled_token_ids[i], *drafts],
        num_computed_tokens=chunk.num_computed_tokens - shift,
        num_draft_tokens=len(drafts),
    )


def sampled_row_map(before: SchedulerOutput, after: SchedulerOutput) -> list[int] | None:
    """Sampled row (as the scheduler counts them, in `before`) -> its row in the filled step
    `after` (-1: a draft slot left empty), for the grammar's mask rows; None where no chunk
    lost slots."""
    pairs = [(b, a) for b, a in zip(before.chunks, after.chunks, strict=True) if b.sample]
    if all(b.num_draft_tokens == a.num_draft_tokens for b, a in pairs):
        return None
    row_map: list[int] = []
    row = 0
    for b, a in pairs:
        num_rows = a.num_draft_tokens + 1
        row_map += range(row, row + num_rows)
        row_map += [-1] * (b.num_draft_tokens - a.num_draft_tokens)
        row += num_rows
    return row_map


def grammar_for_step(grammar: GrammarOutput, row_map: list[int] | None) -> GrammarOutput:
    """The scheduler's grammar output with its rows moved to the filled step's sampled rows
    (row_map: FilledStep.row_map). A constrained chunk has no draft slots: no row maps to -1."""
    if row_map is None:
        return grammar
    return GrammarOutput([row_map[r] for r in grammar.rows], grammar.bitmask)
