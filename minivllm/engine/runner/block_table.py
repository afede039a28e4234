"""The runner's copy of every live request's block table, updated from each step's chunks.

Sending only new block ids keeps the per-step work proportional to what changed, not to
the total context of the batch.
"""

from __future__ import annotations

import numpy as np

from minivllm.engine.types import SchedulerOutput


class BlockTable:
    def __init__(self, max_blocks_per_seq: int, initial_rows: int = 256) -> None:
        self.max_blocks_per_seq = max_blocks_per_seq
        # table[row, i] is block i of the request that owns row; rows are reused.
        self.table = np.zeros((initial_rows, max_blocks_per_seq), dtype=np.int32)
        self.row_of: dict[str, int] = {}
        self.free_rows = list(range(initial_rows - 1, -1, -1))

    def update(self, sched_out: SchedulerOutput) -> list[int]:
        """Forgets finished requests, writes new blocks; returns each chunk's row."""
        for req_id in sched_out.finished_req_ids:
            row = self.row_of.pop(req_id, None)
            if row is not None:
                self.free_rows.append(row)
        rows = []
        for chunk in sched_out.chunks:
            row = self.row_of.get(chunk.req_id)
            if row is None:
                row = self._new_row(chunk.req_id)
            if chunk.new_block_ids:
                start = chunk.num_prior_blocks
                self.table[row, start : start + len(chunk.new_block_ids)] = chunk.new_block_ids
            rows.append(row)
        return rows

    def _new_row(self, req_id: str) -> int:
        if not self.free_rows:
            old = self.table.shape[0]
            self.table = np.concatenate([self.table, np.zeros_like(self.table)])
            self.free_rows = list(range(2 * old - 1, old - 1, -1))
        row = self.free_rows.pop()
        self.row_of[req_id] = row
        return row
