"""SpecDecodingStats: vLLM's counters, observed per draft and per step, merged."""

from __future__ import annotations

import pytest

from minivllm.spec_decode.metrics import (
    SpecDecodingStats,
    acceptance_rate,
    mean_acceptance_length,
)


def test_observe_and_merge():
    stats = SpecDecodingStats(num_spec_tokens=3)
    stats.observe_draft(num_draft_tokens=3, num_accepted_tokens=2)
    stats.observe_step([3, 0, 2], [3, 0, 0])  # the request without drafts is no draft
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 8, 5)
    assert stats.num_accepted_tokens_per_pos == [2, 2, 1]
    other = SpecDecodingStats(3, 1, 3, 1, [1, 0, 0])
    stats.merge(other)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (4, 11, 6)
    assert stats.num_accepted_tokens_per_pos == [3, 2, 1]
    assert acceptance_rate(stats) == 6 / 11
    assert mean_acceptance_length(stats) == 1 + 6 / 4


def test_empty_stats_and_bad_input():
    empty = SpecDecodingStats(2)
    assert acceptance_rate(empty) == 0.0 and mean_acceptance_length(empty) == 1.0
    with pytest.raises(ValueError):
        empty.observe_draft(2, 3)
    with pytest.raises(ValueError):
        empty.observe_draft(3, 1)
    with pytest.raises(ValueError):
        empty.merge(SpecDecodingStats(4))
    with pytest.raises(ValueError):
        SpecDecodingStats(2, num_accepted_tokens_per_pos=[1])
