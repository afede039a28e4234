"""Input preparation: a SchedulerOutput becomes the host arrays of one forward pass.

No torch; the only state is the runner's BlockTable, which it updates first. The runner
copies these arrays to the device.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from minivllm.engine.runner.block_table import BlockTable
from minivllm.engine.types import ScheduledChunk, SchedulerOutput


@dataclass
class StepInputs:
    input_ids: np.ndarray  # [num_tokens] int64
    positions: np.ndarray  # [num_tokens] int64
    slot_mapping: np.ndarray  # [num_tokens] int64
    query_start_loc: np.ndarray  # [num_seqs + 1] int32, attention sequences
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
    # [num_chunks + 1] int32: where each chunk's tokens start (query_start_loc, unless a
    # chunk with drafts is several attention sequences).
    chunk_start_loc: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]


def prepare_inputs(
    sched_out: SchedulerOutput, block_size: int, block_table: BlockTable
) -> StepInputs:
    """Flattens the step's chunks (decodes first, as scheduled) into packed arrays.

    Attention sees one sequence per chunk, except that a decode chunk with drafts is one
    decode row per token, each with its own length (its causal view of the request's KV):
    so that a verify step is a decode step, full CUDA graphs and decode kernel included.
    """
    chunks = sched_out.chunks
    num_chunks = len(chunks)
    chunk_lens = np.fromiter((len(c.token_ids) for c in chunks), np.int32, num_chunks)
    chunk_starts = np.fromiter((c.num_computed_tokens for c in chunks), np.int64, num_chunks)
    chunk_start_loc = np.zeros(num_chunks + 1, np.int32)
    np.cumsum(chunk_lens, out=chunk_start_loc[1:])
    num_tokens = int(chunk_start_loc[-1])
    rows = block_table.update(sched_out)
    num_decodes = sched_out.num_decode_chunks
    num_decode_rows = int(chunk_start_loc[num_decodes])
    query_lens, starts, query_start_loc, rows = _attention_sequences(
        chunk_lens, chunk_starts, chunk_start_loc, num_decodes, rows
    )
    num_seqs = len(query_lens)
    seq_lens = (starts + query_lens).astype(np.int32)
    max_num_blocks = -(-int(seq_lens.max()) // block_size)
    block_tables = block_table.table[rows, :max_num_blocks]

    # Token t of sequence r sits at position starts[r] + (t - query_start_loc[r]).
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
    decode_order = np.argsort(-seq_lens[:num_decode_rows], kind="stable").astype(np.int32)
    sample_req_ids, logits_indices, num_draft_tokens = _sampled_rows(chunks, chunk_start_loc)
    return StepInputs(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slot_mapping,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        block_tables=block_tables,
        logits_indices=logits_indices,
        sample_req_ids=sample_req_ids,
        max_seq_len=int(seq_lens.max()),
        num_decode_tokens=num_decode_rows,
        decode_order=decode_order,
        num_draft_tokens=num_draft_tokens,
        chunk_start_loc=chunk_start_loc,
    )


def _attention_sequences(
    chunk_lens: np.ndarray,
    chunk_starts: np.ndarray,
    chunk_start_loc: np.ndarray,
    num_decodes: int,
    rows: list[int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | list[int]]:
    """Each attention sequence's (query_lens, starts, query_start_loc, block-table rows).

    One sequence per chunk, except that a decode chunk with drafts becomes one decode row per
    token, each starting one position after the one before.
    """
    num_decode_rows = int(chunk_start_loc[num_decodes])
    if num_decode_rows == num_decodes:  # no decode chunk has drafts
        return chunk_lens, chunk_starts, chunk_start_loc, rows
    num_chunks = len(chunk_lens)
    decode_lens = chunk_lens[:num_decodes]
    seq_chunk = np.concatenate(
        [np.repeat(np.arange(num_decodes), decode_lens), np.arange(num_decodes, num_chunks)]
    )
    query_lens = np.ones(len(seq_chunk), np.int32)
    query_lens[num_decode_rows:] = chunk_lens[num_decodes:]
    starts = chunk_starts[seq_chunk]
    starts[:num_decode_rows] += np.arange(num_decode_rows) - np.repeat(
        chunk_start_loc[:num_decodes], decode_lens
    )
    query_start_loc = np.zeros(len(seq_chunk) + 1, np.int32)
    np.cumsum(query_lens, out=query_start_loc[1:])
    return query_lens, starts, query_start_loc, np.asarray(rows)[seq_chunk]


def _sampled_rows(
    chunks: list[ScheduledChunk], chunk_start_loc: np.ndarray
) -> tuple[list[str], np.ndarray, np.ndarray | None]:
    """(sample_req_ids, logits_indices, num_draft_tokens) of the chunks that sample."""
    sampled = [i for i, c in enumerate(chunks) if c.sample]
    ends = chunk_start_loc[1:][sampled].astype(np.int64)
    num_draft_tokens = np.fromiter(
        (chunks[i].num_draft_tokens for i in sampled), np.int64, len(sampled)
    )
    req_ids = [chunks[i].req_id for i in sampled]
    if num_draft_tokens.any():
        return req_ids, _last_rows(ends, num_draft_tokens + 1), num_draft_tokens
    return req_ids, ends - 1, None


def _last_rows(ends: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The last counts[i] rows before ends[i] of each chunk i, in order, concatenated."""
    starts = np.repeat(ends - counts, counts)
    return starts + np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
