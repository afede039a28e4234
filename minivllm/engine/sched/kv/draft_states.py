"""The recurrent states of a hybrid model's drafts (speculative decoding, a grammar's forced
tokens; no torch): which slots of the runner's state pool hold the state after each draft of a
verify step, and what is copied once the step's drafts are verified.

A decode chunk with d drafts runs 1 + d tokens through the linear-attention layers; the state
after each of its first d tokens is written to one of d draft-state slots taken for the step, the
state after all of them to the request's own slot (layers/gated_delta_verify.py). When the
step's result shows j of the drafts accepted, the state after its 1 + j tokens is the one to
keep: already in the request's slot where j == d, else copied there from draft-state slot j before
the next step's forward. The draft-state slots are free again from then on (the next forward writes
them only after that copy). So a rejected draft never reaches a request's state, nor a
snapshot of it: a block boundary inside the accepted tokens is saved from the slot that holds
the state there.
"""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.engine.sched.request import Request
from minivllm.engine.types import StateCopies


@dataclass
class _Verify:
    start: int  # the request's computed tokens before the chunk
    slots: list[int]  # slot i: the state after the chunk's first i + 1 tokens


class DraftStates:
    """num_slots draft-state slots, first_slot onwards in the runner's pool."""

    def __init__(self, first_slot: int, num_slots: int) -> None:
        # Invariant: a slot is free <=> no entry of _verifying holds it. Lowest first.
        self._free_slots = list(range(first_slot + num_slots - 1, first_slot - 1, -1))
        self._verifying: dict[str, _Verify] = {}  # req_id -> its chunk in flight

    @property
    def num_free(self) -> int:
        return len(self._free_slots)

    def take(self, request: Request, num_drafts: int) -> bool:
        """Slots for the states after request's chunk's first num_drafts tokens (the chunk
        being scheduled, from request.num_computed_tokens), in request.draft_state_slots; False,
        changing nothing, when too few are free."""
        if num_drafts > len(self._free_slots):
            return False
        slots = [self._free_slots.pop() for _ in range(num_drafts)]
        self._verifying[request.req_id] = _Verify(request.num_computed_tokens, slots)
        request.draft_state_slots = slots
        return True

    def accept(self, request: Request, num_tokens: int, copies: StateCopies) -> None:
        """request's drafted chunk is verified: its first num_tokens tokens are computed (the
        accepted drafts included). Copies the state after them into its slot before the next
        forward where a draft was rejected, and frees the draft-state slots."""
        verify = self._verifying.pop(request.req_id, None)
        if verify is None:
            return
        accepted = num_tokens - verify.start - 1
        if accepted < len(verify.slots):
            copies.restore_src.append(verify.slots[accepted])
            copies.restore_dst.append(request.state_slot)
        self._free_slots += reversed(verify.slots)
        request.draft_state_slots = []

    def slot_after(self, request: Request, num_tokens: int) -> int:
        """The slot holding request's state after its first num_tokens tokens where they end
        inside its drafted chunk being accepted (call before accept): a draft-state slot, or its own
        slot after the whole chunk; -1 where they end before the chunk's first token."""
        verify = self._verifying[request.req_id]
        index = num_tokens - verify.start - 1
        if index < 0:
            return -1
        return verify.slots[index] if index < len(verify.slots) else request.state_slot

    def release(self, request: Request) -> None:
        """request ends (finished or preempted): its draft-state slots, if any, are free."""
        verify = self._verifying.pop(request.req_id, None)
        if verify is not None:
            self._free_slots += reversed(verify.slots)
        request.draft_state_slots = []
