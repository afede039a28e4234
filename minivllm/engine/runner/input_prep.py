"""Input preparation: a SchedulerOutput becomes the host arrays of one forward pass.

No torch; the only state is the runner's BlockTable, which it updates first. The runner
copies these arrays to the device.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from minivllm.engine.runner.block_table import BlockTable
from minivllm.engine.types import SchedulerOutput


@dataclass
class StepInputs:
    input_ids: np.ndarray  # [num_tokens] int64
    positions: np.ndarray  # [num_tokens] int64
    slot_mapping: np.ndarray  # [num_tokens] int64
    query_start_loc: np.ndarray  # [num_seqs + 1] int32
    seq_lens: np.ndarray  # [num_seqs] int32
    block_tables: np.ndarray  # [num_seqs, max_num_blocks] int32, padded with 0
    logits_indices: np.ndarray  # [num_sampled] int64, last row of each sampling chunk
    sample_req_ids: list[str]  # aligned with logits_indices
    max_seq_len: int
    num_decode_tokens: int
    decode_order: np.ndarray  # [num_decode_tokens] int32, longest context first (stable)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]


def prepare_inputs(
    sched_out: SchedulerOutput, block_size: int, block_table: BlockTable
) -> StepInputs:
    """Flattens the step's chunks (decodes first, as scheduled) into packed arrays."""
    chunks = sched_out.chunks
    num_seqs = len(chunks)
    query_lens = np.fromiter((len(c.token_ids) for c in chunks), np.int32, num_seqs)
    starts = np.fromiter((c.num_computed_tokens for c in chunks), np.int64, num_seqs)
    query_start_loc = np.zeros(num_seqs + 1, np.int32)
    np.cumsum(query_lens, out=query_start_loc[1:])
    seq_lens = (starts + query_lens).astype(np.int32)
    num_tokens = int(query_start_loc[-1])

    rows = block_table.update(sched_out)
    max_num_blocks = -(-int(seq_lens.max()) // block_size)
    block_tables = block_table.table[rows, :max_num_blocks]

    # Token t of request r sits at position starts[r] + (t - query_start_loc[r]).
    seq_index = np.repeat(np.arange(num_seqs), query_lens)
    offsets = np.arange(num_tokens) - np.repeat(query_start_loc[:-1], query_lens)
    positions = np.repeat(starts, query_lens) + offsets
    slot_mapping = (
        block_tables[seq_index, positions // block_size].astype(np.int64) * block_size
        + positions % block_size
    )
    input_ids = np.fromiter(
        itertools.chain.from_iterable(c.token_ids for c in chunks), np.int64, num_tokens
    )
    num_decodes = sched_out.num_decode_chunks
    decode_order = np.argsort(-seq_lens[:num_decodes], kind="stable").astype(np.int32)
    sampled = [i for i, c in enumerate(chunks) if c.sample]
    logits_indices = query_start_loc[1:][sampled].astype(np.int64) - 1
    return StepInputs(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slot_mapping,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        block_tables=block_tables,
        logits_indices=logits_indices,
        sample_req_ids=[chunks[i].req_id for i in sampled],
        max_seq_len=int(seq_lens.max()),
        num_decode_tokens=num_decodes,
        decode_order=decode_order,
    )
