"""prepare_inputs: the packed arrays of one step, here the decode kernel's launch order."""

from __future__ import annotations

from minivllm.engine.runner.block_table import BlockTable
from minivllm.engine.runner.input_prep import prepare_inputs
from minivllm.engine.types import ScheduledChunk, SchedulerOutput

BLOCK = 16


def _chunk(req_id: str, num_computed: int, num_new: int, first_block: int) -> ScheduledChunk:
    num_blocks = -(-(num_computed + num_new) // BLOCK)
    blocks = list(range(first_block, first_block + num_blocks))
    return ScheduledChunk(req_id, [7] * num_new, num_computed, blocks, 0, sample=True)


def test_decode_order_is_longest_context_first_and_stable():
    chunks = [
        _chunk("a", 40, 1, 1),  # context 41
        _chunk("b", 100, 1, 10),  # 101
        _chunk("c", 40, 1, 20),  # 41: after "a", its equal
        _chunk("d", 7, 1, 30),  # 8
        _chunk("e", 0, 20, 40),  # a prefill chunk: not a decode, not ordered
    ]
    inputs = prepare_inputs(SchedulerOutput(chunks, 4), BLOCK, BlockTable(16, 8))
    assert inputs.seq_lens.tolist() == [41, 101, 41, 8, 20]
    assert inputs.decode_order.dtype.name == "int32"
    assert inputs.decode_order.tolist() == [1, 0, 2, 3]


def test_prefill_only_step_has_no_decode_order():
    inputs = prepare_inputs(SchedulerOutput([_chunk("p", 0, 33, 1)], 0), BLOCK, BlockTable(16, 8))
    assert inputs.decode_order.shape == (0,)
