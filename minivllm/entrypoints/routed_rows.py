"""One sample's routed experts in the frontend (enable_return_routed_experts): the core's rows,
in position order, in one array that a streamed output reads without a copy per step."""

from __future__ import annotations

import numpy as np


class RoutedRows:
    """rows[:num_rows]: [num_rows, sparse layers, top_k], the routing of the sample's positions
    forwarded so far. The array grows geometrically, never past max_rows (prompt + max_tokens
    - 1: the last token is never forwarded), the bound of a sample's routing buffer; a core
    that hands over more (a bound unknown: None) still grows it."""

    __slots__ = ("_rows", "num_rows", "max_rows")

    def __init__(self, max_rows: int | None) -> None:
        self._rows: np.ndarray | None = None  # allocated at the first rows: nothing when off
        self.num_rows = 0
        self.max_rows = max_rows

    def append(self, rows: np.ndarray) -> None:
        """Adds the rows of the positions forwarded since the last call. Rows already
        appended never change, so a view handed out before stays right."""
        needed = self.num_rows + len(rows)
        if self._rows is None or needed > len(self._rows):
            capacity = max(2 * needed, 16)
            if self.max_rows is not None:
                capacity = max(needed, min(capacity, self.max_rows))
            grown = np.empty((capacity, *rows.shape[1:]), rows.dtype)
            if self._rows is not None:
                grown[: self.num_rows] = self._rows[: self.num_rows]
            self._rows = grown  # views of the old array stay valid (they keep it alive)
        self._rows[self.num_rows : needed] = rows
        self.num_rows = needed

    @property
    def capacity(self) -> int:
        """Rows the array holds (its bytes: capacity x sparse layers x top_k x itemsize)."""
        return 0 if self._rows is None else len(self._rows)

    def view(self) -> np.ndarray | None:
        """The rows so far, no copy (None before any): a streamed output's."""
        return None if self._rows is None else self._rows[: self.num_rows]

    def final(self) -> np.ndarray | None:
        """The rows of a finished sample, in an array of their own: the growth's slack is
        dropped, once (a sample of n > 1 that finished first is read again each step)."""
        if self._rows is not None and self.num_rows != len(self._rows):
            self._rows = self._rows[: self.num_rows].copy()
        return self._rows
