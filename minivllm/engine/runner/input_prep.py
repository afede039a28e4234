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
    # [num_sampled_rows] int64: the last row of each sampling chunk, or its last
    # num_draft_tokens + 1 rows when it has drafts (one per position to sample).
    logits_indices: np.ndarray
    sample_req_ids: list[str]  # one per sampling chunk
    max_seq_len: int
    num_decode_tokens: int
    decode_order: np.ndarray  # [num_decode_tokens] int32, longest context first (stable)
    # [len(sample_req_ids)] int64, each sampling chunk's drafts; None when no chunk has any.
    num_draft_tokens: np.ndarray | None = None

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
    ends = query_start_loc[1:][sampled].astype(np.int64)
    num_draft_tokens = np.fromiter(
        (chunks[i].num_draft_tokens for i in sampled), np.int64, len(sampled)
    )
    if num_draft_tokens.any():
        logits_indices = _last_rows(ends, num_draft_tokens + 1)
    else:
        logits_indices, num_draft_tokens = ends - 1, None
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
        num_draft_tokens=num_draft_tokens,
    )


def _last_rows(ends: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The last counts[i] rows before ends[i] of each chunk i, in order, concatenated."""
    starts = np.repeat(ends - counts, counts)
    return starts + np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
