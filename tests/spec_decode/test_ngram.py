"""NgramProposer: hand-made histories (longest n first, earliest occurrence, no match, k cut at
the end, caps) and random batches against a brute-force reference, also as histories grow
step by step under their request ids (the per-request index extended, not rebuilt)."""

from __future__ import annotations

import numpy as np
import pytest

from minivllm.spec_decode.config import SpeculativeConfig
from minivllm.spec_decode.ngram import NgramProposer
from minivllm.spec_decode.proposer import ProposeInput


def propose(histories, k=4, max_n=3, min_n=1, caps=None) -> list[list[int]]:
    proposer = NgramProposer(k, max_n, min_n)
    return proposer.propose(ProposeInput.from_lists(histories, caps)).to_lists()


def reference(history: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """Brute force: n from max_n down to min_n, the earliest earlier occurrence of the suffix."""
    length = len(history)
    for n in range(max_n, min_n - 1, -1):
        if n >= length:
            continue
        suffix = history[-n:]
        for start in range(length - n):  # the occurrence ends before the last token
            if history[start : start + n] == suffix:
                return history[start + n : start + n + k]
    return []


def test_vllm_docstring_example():
    assert propose([[1, 2, 3, 4, 2, 3]], k=4, max_n=3, min_n=2) == [[4, 2, 3]]


def test_longest_n_wins_over_an_earlier_shorter_match():
    history = [5, 6, 9, 1, 5, 6, 7, 8, 1, 5, 6]
    assert propose([history], k=3, max_n=3) == [[7, 8, 1]]
    assert propose([history], k=3, max_n=2) == [[9, 1, 5]]


def test_earliest_occurrence_is_taken():
    assert propose([[1, 2, 7, 1, 2, 8, 1, 2]], k=3, max_n=2, min_n=2) == [[7, 1, 2]]


def test_min_n_and_no_match():
    history = [1, 2, 9, 3, 2]
    assert propose([history], max_n=2, min_n=2) == [[]]
    assert propose([history], k=3, max_n=2, min_n=1) == [[9, 3, 2]]
    assert propose([[1, 2, 3, 4]], min_n=1) == [[]]


def test_drafts_stop_at_the_end_of_the_history():
    assert propose([[1, 2, 3, 1, 2]], k=5, max_n=2, min_n=2) == [[3, 1, 2]]
    # An occurrence may overlap the suffix: [7, 7] first ends at index 1.
    assert propose([[7, 7, 7, 7]], k=3, max_n=2, min_n=2) == [[7, 7]]


def test_k_and_per_request_caps():
    history = [1, 2, 3, 4, 5, 6, 1, 2]
    assert propose([history], k=3, max_n=2) == [[3, 4, 5]]
    assert propose([history, history, history], k=3, max_n=2, caps=[0, 2, 9]) == [
        [],
        [3, 4],
        [3, 4, 5],
    ]


def test_output_arrays_are_padded():
    drafts = NgramProposer(4, 2, 1).propose(ProposeInput.from_lists([[1, 2, 3, 1], [5]]))
    assert drafts.token_ids.shape == (2, 4) and drafts.token_ids.dtype == np.int64
    assert drafts.token_ids.tolist() == [[2, 3, 1, -1], [-1, -1, -1, -1]]
    assert drafts.num_draft_tokens.tolist() == [3, 0]
    assert drafts.probs is None


def test_short_and_empty_rows():
    assert propose([[], [3], [3, 3]], k=2, max_n=3, min_n=1) == [[], [], [3]]
    assert propose([], k=2) == []


@pytest.mark.parametrize("max_n,min_n", [(5, 5), (4, 2), (3, 1), (2, 2), (1, 1)])
def test_random_batches_match_the_reference(max_n, min_n):
    rng = np.random.default_rng(max_n * 10 + min_n)
    k = 4
    for _ in range(20):
        histories = [
            rng.integers(0, int(rng.integers(2, 6)), int(rng.integers(0, 60))).tolist()
            for _ in range(int(rng.integers(1, 9)))
        ]
        expected = [reference(h, k, max_n, min_n) for h in histories]
        assert propose(histories, k=k, max_n=max_n, min_n=min_n) == expected


@pytest.mark.parametrize("max_n,min_n", [(4, 2), (3, 1), (5, 5)])
def test_growing_histories_match_the_reference_at_every_step(max_n, min_n):
    """Requests keep their index between calls: each step appends 1-5 tokens (as accepted
    drafts do), some rows skip a step (cap 0), one request leaves and its id returns with
    another, longer history (a stale index would propose from the old one)."""
    rng = np.random.default_rng(max_n)
    k = 4
    proposer = NgramProposer(k, max_n, min_n)
    histories = {str(i): rng.integers(0, 4, int(rng.integers(0, 20))).tolist() for i in range(5)}
    for step in range(60):
        if step == 30:  # request 0 finishes; a new one reuses its id
            proposer.remove_requests(["0"])
            histories["0"] = rng.integers(0, 4, 300).tolist()
        ids = sorted(histories)
        caps = [int(rng.integers(0, 6)) for _ in ids]
        batch = ProposeInput.from_lists([histories[i] for i in ids], caps, ids)
        got = proposer.propose(batch).to_lists()
        expected = [reference(histories[i], min(k, c), max_n, min_n) for i, c in zip(ids, caps)]
        assert got == expected, f"step {step}"
        for i in ids:
            histories[i] += rng.integers(0, 4, int(rng.integers(1, 6))).tolist()


def test_an_index_is_rebuilt_for_a_history_that_is_not_the_one_it_indexed():
    proposer = NgramProposer(2, 2, 2)
    long = [1, 2, 3, 1, 2, 4, 4, 4, 4]
    assert proposer.propose(ProposeInput.from_lists([long], None, ["a"])).to_lists() == [[4, 4]]
    short = [5, 6, 7, 5, 6]  # shorter than what "a" indexed: a fresh index
    assert proposer.propose(ProposeInput.from_lists([short], None, ["a"])).to_lists() == [[7, 5]]


def test_from_config():
    config = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3})
    proposer = NgramProposer.from_config(config)
    assert (proposer.num_speculative_tokens, proposer.prompt_lookup_max) == (3, 5)
    assert proposer.prompt_lookup_min == 5
    with pytest.raises(ValueError):
        NgramProposer(3, 2, 4)
