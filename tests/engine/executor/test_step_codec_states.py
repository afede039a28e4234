"""The step message of a hybrid model: each chunk's recurrent-state slot, its draft-state slots
and draft cap, and the step's state copies (prefix snapshots restored and saved) reach the
other ranks as rank 0 scheduled them."""

from __future__ import annotations

from minivllm.engine.executor.step_codec import Op, decode, encode
from minivllm.engine.types import ScheduledChunk, SchedulerOutput, StateCopies


def test_state_slots_and_copies_round_trip() -> None:
    chunks = [
        ScheduledChunk(
            "a", [7, 8, 9], 12, [], 3, True, 2, 2, draft_cap=4, draft_state_slots=[5, 6]
        ),
        ScheduledChunk("b", [1, 2, 3], 0, [4], 0, True, state_slot=0),
    ]
    copies = StateCopies(restore_src=[9], restore_dst=[0], save_src=[2, 0], save_dst=[8, 10])
    sched_out = SchedulerOutput(chunks, 1, state_copies=copies)
    op, back, _ = decode(encode(Op.FORWARD, sched_out))
    assert op == Op.FORWARD and back == sched_out
    assert [c.state_slot for c in back.chunks] == [2, 0] and back.state_copies == copies
    assert back.chunks[0].draft_state_slots == [5, 6] and back.chunks[0].draft_cap == 4
    plain = SchedulerOutput(chunks, 1)
    assert decode(encode(Op.FORWARD, plain)).sched_out.state_copies is None
