"""Draft slots filled at launch (engine/runner/drafts/draft_slots.py): a chunk scheduled while the
step that drafts for it was in flight gets that step's token, the proposals in its slots (fewer
where fewer were proposed) and positions moved back by the step's rejected drafts; the grammar's
mask rows follow the rows that remain."""

from __future__ import annotations

from minivllm.engine.runner.drafts.draft_slots import (
    draft_slots,
    fill_draft_slots,
    needs_filling,
    sampled_row_map,
)
from minivllm.engine.types import (
    PLACEHOLDER_TOKEN_ID as PH,
)
from minivllm.engine.types import (
    RunnerOutput,
    ScheduledChunk,
    SchedulerOutput,
)


def _chunk(req_id: str, token_ids: list[int], start: int, drafts: int = 0) -> ScheduledChunk:
    return ScheduledChunk(req_id, token_ids, start, [], 0, True, drafts)


def test_slots_filled_and_positions_moved_back() -> None:
    before = SchedulerOutput(
        [
            _chunk("a", [PH, PH, PH, PH], 9, drafts=3),  # slots, after 3 drafts in flight
            _chunk("b", [PH], 4),  # a plain pending token: filled on the device
            _chunk("c", [1, 2, 3], 0),  # a prompt
        ],
        num_decode_chunks=2,
    )
    prev_slots = {"a": 3}  # the step before gave a 3 draft slots
    assert needs_filling(before, prev_slots)
    assert not needs_filling(SchedulerOutput(before.chunks[1:], 1), prev_slots)
    # The step before: a kept 1 of its 3 drafts, then the target's 10; 2 proposals after.
    prev = RunnerOutput(["b", "a"], [20, 10], num_accepted_drafts=[0, 1],
                        num_draft_tokens=[0, 3], accepted_draft_ids=[[], [7]],
                        draft_token_ids={"a": [11, 12]})  # fmt: skip
    after = fill_draft_slots(before, prev_slots, prev)
    a, b, c = after.chunks
    assert (a.token_ids, a.num_computed_tokens, a.num_draft_tokens) == ([10, 11, 12], 7, 2)
    assert b == before.chunks[1] and c == before.chunks[2]
    assert before.chunks[0].token_ids == [PH, PH, PH, PH]  # the scheduler's step is untouched
    assert draft_slots(before) == {"a": 3}
    # Sampled rows: a's 4 (its last slot left empty), then b's, then c's.
    assert sampled_row_map(before, after) == [0, 1, 2, -1, 3, 4]
    assert sampled_row_map(before, before) is None


def test_positions_moved_back_without_slots() -> None:
    """A request past its room for drafts still starts where its drafts in flight would all
    be accepted; none was: it goes back by all of them."""
    before = SchedulerOutput([_chunk("a", [PH], 9)], num_decode_chunks=1)
    prev = RunnerOutput(["a"], [10], num_accepted_drafts=[0], num_draft_tokens=[2],
                        accepted_draft_ids=[[]])  # fmt: skip
    (a,) = fill_draft_slots(before, {"a": 3}, prev).chunks
    assert (a.token_ids, a.num_computed_tokens, a.num_draft_tokens) == ([10], 6, 0)
