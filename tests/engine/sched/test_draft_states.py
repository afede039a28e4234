"""Drafts on a hybrid model's KV coordinator (draft_states.py): a decode chunk with d drafts
takes d draft-state slots (after the running and snapshot slots), or nothing when too few are free;
once its drafts are verified (trim), the state after the accepted ones is copied into the
request's slot before the next forward (none where all were accepted), a block boundary among
the accepted tokens is saved in the rolling snapshot from the slot that holds it, and the draft
slots are free again (on free, too)."""

from __future__ import annotations

from minivllm.engine.sched.kv.kv_coordinator import HybridKVCoordinator
from minivllm.engine.sched.request import Request
from minivllm.sampling_params import SamplingParams

BLOCK_SIZE = 4


def prefilled(coordinator: HybridKVCoordinator, req_id: str, num_prompt: int) -> Request:
    """A request whose prompt is computed and whose first output token is known."""
    request = Request(req_id, list(range(1, num_prompt + 1)), SamplingParams(), 0.0)
    request.block_ids += coordinator.allocate_slots(request, num_prompt)
    request.num_computed_tokens = num_prompt
    request.append_output_token(100)
    return request


def schedule_drafts(coordinator: HybridKVCoordinator, request: Request, num_drafts: int):
    """The decode chunk of request's last token and num_drafts drafts, as the scheduler
    allocates it; None where it does not fit."""
    new_block_ids = coordinator.allocate_slots(request, 1 + num_drafts)
    if new_block_ids is not None:
        request.block_ids += new_block_ids
        request.num_computed_tokens += 1 + num_drafts
    return new_block_ids


def verify(coordinator: HybridKVCoordinator, request: Request, num_drafts: int, accepted: int):
    """The scheduler's update of the chunk: accepted drafts kept, then the target's token."""
    request.num_computed_tokens -= num_drafts - accepted
    coordinator.trim(request, request.num_computed_tokens + 1)
    for token in range(accepted + 1):
        request.append_output_token(200 + token)


def test_draft_state_slots_follow_verify_steps() -> None:
    coordinator = HybridKVCoordinator(8, BLOCK_SIZE, num_state_slots=2, num_draft_state_slots=4)
    assert coordinator.takes_drafts and coordinator.num_free_draft_state_slots == 4
    a, b = prefilled(coordinator, "a", 5), prefilled(coordinator, "b", 3)
    assert schedule_drafts(coordinator, a, 3) is not None
    assert a.draft_state_slots == [2, 3, 4] and coordinator.num_free_draft_state_slots == 1
    # Two drafts need two slots: b gets nothing, not even blocks.
    num_free_blocks = coordinator.num_free_blocks
    assert schedule_drafts(coordinator, b, 2) is None
    assert b.draft_state_slots == [] and coordinator.num_free_blocks == num_free_blocks
    assert schedule_drafts(coordinator, b, 1) is not None and b.draft_state_slots == [5]
    assert coordinator.take_state_copies() is None
    verify(coordinator, a, 3, accepted=1)  # the state after 2 tokens: draft-state slot 1 of a's
    verify(coordinator, b, 1, accepted=1)  # all accepted: b's slot holds it already
    copies = coordinator.take_state_copies()
    assert (copies.restore_src, copies.restore_dst) == ([3], [a.state_slot])
    assert copies.save_src == [] and coordinator.num_free_draft_state_slots == 4
    assert a.draft_state_slots == [] and b.draft_state_slots == []
    # A finished or preempted request gives its draft-state slots back.
    assert schedule_drafts(coordinator, a, 2) is not None
    coordinator.free(a)
    assert coordinator.num_free_draft_state_slots == 4


def test_accepted_block_boundary_is_saved_from_its_draft_slot() -> None:
    """Prompt 6 (its snapshot point 4), then a chunk over positions 6-9: two drafts accepted
    put the boundary at 8 among the accepted tokens, whose state is in the chunk's second
    draft-state slot: it goes to a rolling snapshot before the next forward, with the restore."""
    coordinator = HybridKVCoordinator(
        16, BLOCK_SIZE, num_state_slots=2, num_snapshot_slots=6, num_draft_state_slots=3
    )
    request = prefilled(coordinator, "a", 6)
    coordinator.take_state_copies()
    schedule_drafts(coordinator, request, 3)
    first_draft = 2 + 6  # after the running slots and the snapshots
    assert request.draft_state_slots == [first_draft, first_draft + 1, first_draft + 2]
    # The chunk's end (10) is no state to save: nothing after its forward.
    assert coordinator.take_state_copies() is None
    verify(coordinator, request, 3, accepted=2)
    copies = coordinator.take_state_copies()
    assert copies.restore_src == [first_draft + 1, first_draft + 2]
    rolling_slot = copies.restore_dst[0]
    assert 2 <= rolling_slot < 8 and copies.restore_dst[1] == request.state_slot
    assert copies.save_src == []
    # Rejected at once: the state after the chunk's first token, no boundary among them.
    schedule_drafts(coordinator, request, 2)
    verify(coordinator, request, 2, accepted=0)
    copies = coordinator.take_state_copies()
    assert (copies.restore_src, copies.restore_dst) == ([first_draft], [request.state_slot])


def test_no_draft_state_slots_no_drafts() -> None:
    coordinator = HybridKVCoordinator(8, BLOCK_SIZE, num_state_slots=2)
    assert not coordinator.takes_drafts and coordinator.num_free_draft_state_slots == 0
    assert schedule_drafts(coordinator, prefilled(coordinator, "a", 5), 1) is None
