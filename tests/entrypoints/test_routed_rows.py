"""RoutedRows, a sample's routed experts in the frontend: the rows in order whatever the
chunks, views handed out before a growth unchanged, the array never past the sample's most
rows (prompt + max_tokens - 1) and trimmed to its rows once finished."""

from __future__ import annotations

import numpy as np

from minivllm.entrypoints.routed_rows import RoutedRows

ROWS = np.arange(40 * 3 * 2, dtype=np.uint8).reshape(40, 3, 2)  # [rows, sparse layers, top_k]


def test_rows_views_and_the_bound() -> None:
    rows = RoutedRows(max_rows=40)
    assert rows.view() is None and rows.final() is None and rows.capacity == 0
    views = []
    for start, end in [(0, 13), *((i, i + 1) for i in range(13, 37)), (37, 40)]:
        rows.append(ROWS[start:end])
        views.append((end, rows.view()))
        assert rows.num_rows == end <= rows.capacity <= 40
    for end, view in views:  # each still the rows it had, though the array grew since
        np.testing.assert_array_equal(view, ROWS[:end])
    assert rows.capacity == 40 and rows.final() is rows.view().base


def test_final_drops_the_slack_once() -> None:
    rows = RoutedRows(max_rows=None)  # unknown bound: grows as needed
    rows.append(ROWS[:20])
    rows.append(ROWS[20:21])
    assert rows.capacity > 21
    final = rows.final()
    np.testing.assert_array_equal(final, ROWS[:21])
    assert rows.capacity == 21 and rows.final() is final and final.dtype == np.uint8


def test_more_rows_than_the_bound_still_fit() -> None:
    rows = RoutedRows(max_rows=4)
    rows.append(ROWS[:3])
    rows.append(ROWS[3:6])
    np.testing.assert_array_equal(rows.final(), ROWS[:6])
