"""The running sum of a mean-pooled prompt across its chunks, in bytes bounded by construction
and in bits that do not depend on how the prompt was chunked or batched.

The rows are summed in position-aligned segments of SEGMENT_ROWS: each segment by a pairwise
tree of elementwise adds (correctly rounded, so a segment's sum is the same bits whether it is
reduced alone or beside others), the segments' sums added in position order into one float32
vector. A live prompt holds that vector and the rows of its segment in progress.
"""

from __future__ import annotations

import torch

SEGMENT_ROWS = 64  # a power of two: the tree halves it
# Rows reduced at once: the bound on one call's workspace, whatever the chunk's length.
SLAB_ROWS = 16 * SEGMENT_ROWS


def segment_sums(rows: torch.Tensor) -> torch.Tensor:
    """rows: [k * SEGMENT_ROWS, hidden] -> [k, hidden] float32, each segment's sum; a segment's
    bits depend on its own rows alone (not on k)."""
    x = rows.float().reshape(-1, SEGMENT_ROWS, rows.shape[-1])
    while x.shape[1] > 1:
        x = x[:, 0::2] + x[:, 1::2]
    return x[:, 0]


class MeanSum:
    """One prompt's rows so far: the complete segments' sum (float32 [hidden]) and a copy of
    the rows of the segment in progress (fewer than SEGMENT_ROWS, in the rows' dtype)."""

    def __init__(self) -> None:
        self.num_rows = 0
        self.total: torch.Tensor | None = None
        self.pending: torch.Tensor | None = None

    def add(self, rows: torch.Tensor) -> None:
        """rows: [n, hidden], the prompt's next n positions. Not kept: rows may be a graph's
        buffer, rewritten next step."""
        for start in range(0, rows.shape[0], SLAB_ROWS):
            self._add_slab(rows[start : start + SLAB_ROWS])
        self.num_rows += rows.shape[0]

    def _add_slab(self, rows: torch.Tensor) -> None:
        if self.pending is not None:
            rows = torch.cat([self.pending, rows])
        num_whole = rows.shape[0] // SEGMENT_ROWS * SEGMENT_ROWS
        if num_whole:
            self._fold(segment_sums(rows[:num_whole]))
        # A copy: the segment in progress outlives the step's rows (and the slab's cat).
        self.pending = rows[num_whole:].clone() if num_whole < rows.shape[0] else None

    def _fold(self, sums: torch.Tensor) -> None:
        """Adds segment sums [k, hidden] in position order (one order, however chunked)."""
        if self.total is None:
            self.total = torch.zeros(sums.shape[1], dtype=torch.float32, device=sums.device)
        for row in sums:
            self.total = self.total + row

    def mean(self) -> torch.Tensor:
        """The mean of every row added: [hidden] float32. The last segment in progress is
        padded with zero rows to SEGMENT_ROWS and reduced as a whole one."""
        if self.pending is not None:
            last = self.pending.new_zeros(SEGMENT_ROWS, self.pending.shape[1])
            last[: self.pending.shape[0]] = self.pending
            self._fold(segment_sums(last))
            self.pending = None
        assert self.total is not None and self.num_rows > 0
        return self.total / self.num_rows


def mean_sum_bytes(hidden_size: int, dtype: torch.dtype) -> tuple[int, int]:
    """(the most bytes a live MeanSum holds between calls, the most one add() or mean() call
    allocates beside them) for rows of hidden_size in dtype."""
    item = torch.empty(0, dtype=dtype).element_size()
    held = (SEGMENT_ROWS - 1) * hidden_size * item + hidden_size * 4
    # A slab joined to the segment in progress, the copy of its new one, its float32 copy and
    # the tree's levels (half of it, a quarter, ...: under its size again).
    workspace = (SLAB_ROWS + 2 * SEGMENT_ROWS) * hidden_size * item
    workspace += 2 * SLAB_ROWS * hidden_size * 4
    return held, workspace
