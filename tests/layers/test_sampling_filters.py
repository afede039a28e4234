"""Top-k / top-p / min-p thresholds against a plain per-row definition, on both paths."""

from __future__ import annotations

import math

import pytest
import torch

from minivllm.layers import sampling_filters
from minivllm.layers.sampling_filters import can_filter_by_candidates, keep_thresholds


def kept_by_definition(row: list[float], temperature: float, k: int, p: float, min_p: float):
    """The set of ids vLLM's filters keep for one row, written out token by token."""
    t = temperature if temperature > 0 else 1.0
    order = sorted(range(len(row)), key=lambda i: -row[i])
    kept = set(order)
    if 0 < k < len(row):
        kth = row[order[k - 1]]
        kept = {i for i in kept if row[i] >= kth}
    if p < 1.0:
        top = max(row[i] for i in kept)
        weights = {i: math.exp((row[i] - top) / t) for i in kept}
        total = sum(weights.values())
        before, chosen, last = 0.0, set(), None
        for i in sorted(kept, key=lambda i: -row[i]):
            if before < p * total or last is None:
                chosen.add(i)
                last = row[i]
            before += weights[i]
        kept = {i for i in kept if row[i] >= last}  # ties of the last kept stay
    if min_p > 0.0:
        top = max(row)
        kept = {i for i in kept if math.exp((row[i] - top) / t) >= min_p}
    return kept


def kept_sets(logits, temperature, top_k, top_p, min_p, by_candidates):
    threshold = keep_thresholds(
        logits,
        torch.tensor(temperature),
        torch.tensor(top_k),
        torch.tensor(top_p),
        torch.tensor(min_p) if any(min_p) else None,
        max(top_k),
        by_candidates,
    )
    return [set(torch.nonzero(row >= t).flatten().tolist()) for row, t in zip(logits, threshold)]


CASES = [
    # temperature, top_k, top_p, min_p
    (0.7, 20, 0.8, 0.0),
    (1.0, 5, 0.95, 0.0),
    (0.3, 1, 0.5, 0.0),
    (1.3, 40, 1.0, 0.0),
    (1.0, 50, 0.999, 0.1),
    (0.9, 3, 1e-9, 0.0),
    (1.0, 200, 0.6, 0.05),  # top_k above the vocabulary
]


@pytest.mark.parametrize("by_candidates", [True, False])
def test_thresholds_keep_what_the_definition_keeps(by_candidates: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    vocab = 100
    logits = torch.randn(len(CASES), vocab, generator=gen) * 3
    logits = (logits * 4).round() / 4  # coarse values: many ties, some at the k-th
    temperature, top_k, top_p, min_p = (list(c) for c in zip(*CASES, strict=True))
    assert can_filter_by_candidates(top_k, top_p)
    got = kept_sets(logits, temperature, top_k, top_p, min_p, by_candidates)
    for row, case in enumerate(CASES):
        assert got[row] == kept_by_definition(logits[row].tolist(), *case), case


def test_ties_with_the_kth_beyond_the_candidates_share_the_mass() -> None:
    # Ten tokens tied for first, top_k 2: all ten are kept by top-k; top_p 0.5 keeps them all
    # too (the threshold is their common value), which the candidates alone cannot tell.
    logits = torch.full((1, 64), -5.0)
    logits[0, 10:20] = 3.0
    got = kept_sets(logits, [1.0], [2], [0.5], [0.0], by_candidates=True)
    assert got == [set(range(10, 20))]
    assert got == kept_sets(logits, [1.0], [2], [0.5], [0.0], by_candidates=False)


def test_top_p_alone_or_a_large_top_k_cannot_use_candidates() -> None:
    assert not can_filter_by_candidates([0], [0.9])
    assert not can_filter_by_candidates([sampling_filters.TOP_K_CAP + 1], [1.0])
    assert can_filter_by_candidates([0, 20], [1.0, 0.95])


def test_the_sort_fallback_works_in_bounded_chunks_of_rows(monkeypatch) -> None:
    # A workspace of three rows at a time gives the thresholds of one whole sort.
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 50, generator=gen)
    args = (torch.ones(8), None, torch.full((8,), 0.7), None, 0, False)
    whole = keep_thresholds(logits, *args)
    row_bytes = sampling_filters.SORT_BYTES_PER_ELEMENT * 50
    monkeypatch.setattr(sampling_filters, "SORT_WORKSPACE_BYTES", 3 * row_bytes)
    assert torch.equal(keep_thresholds(logits, *args), whole)
    for row, t in zip(logits, whole, strict=True):
        assert set(torch.nonzero(row >= t).flatten().tolist()) == kept_by_definition(
            row.tolist(), 1.0, 0, 0.7, 0.0
        )
