"""Exact verification: greedy rows follow the argmax chain; seeded random rows accept exactly
the tokens that the non-speculative sampler draws token by token under the same keys."""

from __future__ import annotations

import dataclasses

import torch

from minivllm.engine.runner.sampling.sampling_state import SamplingState
from minivllm.engine.types import NewRequestData
from minivllm.layers.sampler import DRAW_SHIFT, Sampler
from minivllm.sampling_params import SamplingParams
from minivllm.spec_decode.verify import (
    position_keys,
    position_rows,
    verify_exact,
    verify_rejection,
)

VOCAB = 48


def drafts_tensor(drafts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    k = max((len(d) for d in drafts), default=0)
    padded = torch.tensor([d + [-1] * (k - len(d)) for d in drafts], dtype=torch.int64)
    return padded.reshape(len(drafts), k), torch.tensor([len(d) for d in drafts])


def test_position_rows_and_keys():
    num_draft = torch.tensor([2, 0, 1])
    assert position_rows(num_draft, 2).tolist() == [[0, 1, 2], [3, 4, 5], [4, 5, 6]]
    seeds, offsets = position_keys(
        torch.tensor([7, 8, 9]), torch.tensor([5, 0, 3]), num_draft, total=6
    )
    assert seeds.tolist() == [7, 7, 7, 8, 9, 9]
    assert (offsets >> DRAW_SHIFT).tolist() == [5, 6, 7, 0, 3, 4]


def test_greedy_follows_the_argmax_chain():
    torch.manual_seed(0)
    drafts = [[3, 4, 5], [1, 2], [], [6, 7, 8]]
    draft_ids, num_draft = drafts_tensor(drafts)
    logits = torch.randn(int((num_draft + 1).sum()), VOCAB)
    rows = position_rows(num_draft, 3)
    # Row 0 matches its first two drafts, row 1 all (then the bonus), row 3 none.
    for i, j in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        logits[rows[i, j], drafts[i][j]] = 100.0
    out = verify_exact(logits.argmax(-1), draft_ids, num_draft)
    argmax = logits.argmax(-1)
    assert out.num_accepted.tolist() == [2, 2, 0, 0]
    assert out.output_token_ids.tolist() == [
        [3, 4, int(argmax[2]), -1],
        [1, 2, int(argmax[6]), -1],
        [int(argmax[7]), -1, -1, -1],
        [int(argmax[8]), -1, -1, -1],
    ]


def test_all_accepted_gives_the_bonus_token():
    target = torch.tensor([10, 11, 12, 13])
    out = verify_exact(target, torch.tensor([[10, 11, 12]]), torch.tensor([3]))
    assert out.num_accepted.tolist() == [3]
    assert out.output_token_ids.tolist() == [[10, 11, 12, 13]]


def test_a_later_match_after_a_mismatch_is_not_accepted():
    target = torch.tensor([10, 11, 12, 13])
    out = verify_exact(target, torch.tensor([[10, 99, 12]]), torch.tensor([3]))
    assert out.num_accepted.tolist() == [1]
    assert out.output_token_ids.tolist() == [[10, 11, -1, -1]]


def test_no_drafts_is_one_plain_step():
    target = torch.tensor([4, 9])
    for verify_op in (
        lambda d, n: verify_exact(target, d, n),
        lambda d, n: verify_rejection(torch.eye(VOCAB)[target], d, n),
    ):
        out = verify_op(torch.zeros(2, 0, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))
        assert out.num_accepted.tolist() == [0, 0]
        assert out.output_token_ids.tolist() == [[4], [9]]


def keyed_state(requests: list[tuple[str, SamplingParams, int]]) -> SamplingState:
    """A SamplingState whose every batch draws with keyed noise (as on CUDA), each request
    having sampled num_sampled tokens already."""
    state = SamplingState("cpu")
    state.keyed_draws = True
    for req_id, params, num_sampled in requests:
        state.add_request(NewRequestData(req_id, [1, 2, 3], params))
        for _ in range(num_sampled):
            state.build_metadata([req_id])
    return state


def sequential(state, sampler, req_id, logits_rows, drafts, stop=True) -> list[int]:
    """The non-speculative decode: one sampler call per position (each its next draw),
    stopping after the first token that differs from the draft (or after the bonus)."""
    tokens = []
    for j, logits in enumerate(logits_rows):
        token = int(sampler(logits[None], state.build_metadata([req_id])).sampled_token_ids[0])
        tokens.append(token)
        if stop and (j == len(drafts) or token != drafts[j]):
            break
    return tokens


def test_seeded_exact_equals_token_by_token_sampling():
    """The key property: one sampler call over all k + 1 positions under position_keys, then
    verify_exact, yields the tokens that non-speculative steps yield for the same logits."""
    torch.manual_seed(3)
    requests = [
        ("greedy", SamplingParams(temperature=0.0), 0),
        ("seeded", SamplingParams(temperature=1.0, seed=11), 4),
        ("topk", SamplingParams(temperature=0.8, top_k=3, seed=5), 2),
        ("hot", SamplingParams(temperature=1.5, seed=2), 0),
        ("nodraft", SamplingParams(temperature=1.0, seed=9), 1),
    ]
    req_ids = [r[0] for r in requests]
    sampler = Sampler(use_triton=True)
    num_draft = torch.tensor([3, 3, 3, 3, 0])
    total = int((num_draft + 1).sum())
    logits = torch.randn(total, VOCAB) * 3  # peaked: drafts from a reference are plausible
    rows = position_rows(num_draft, 3)
    own = [[logits[int(rows[r, j])] for j in range(int(num_draft[r]) + 1)] for r in range(5)]
    # Drafts: request r keeps the first keep[r] tokens the sampler draws, then a wrong one.
    keep = [1, 0, 2, 3, 0]
    drafts = []
    for r, req_id in enumerate(req_ids):
        chain = sequential(keyed_state(requests), sampler, req_id, own[r], [-5] * 3, stop=False)
        wrong = [(t + 1) % VOCAB for t in chain]
        drafts.append((chain[: keep[r]] + wrong[keep[r] :])[: int(num_draft[r])])
    expected = [
        sequential(keyed_state(requests), sampler, req_id, own[r], drafts[r])
        for r, req_id in enumerate(req_ids)
    ]
    assert [len(e) - 1 for e in expected] == keep

    state = keyed_state(requests)
    first_draws = torch.tensor([state.requests[req_id].num_sampled for req_id in req_ids])
    seeds = torch.tensor([p.seed or 0 for _, p, _ in requests])
    repeated = [req_id for r, req_id in enumerate(req_ids) for _ in range(int(num_draft[r]) + 1)]
    meta = state.build_metadata(repeated)
    row_seeds, row_offsets = position_keys(seeds, first_draws, num_draft, total)
    meta = dataclasses.replace(meta, seeds=row_seeds, offsets=row_offsets)
    assert not meta.is_plain  # the top-k row sends the batch down the filtered draw
    target = sampler(logits, meta).sampled_token_ids
    draft_ids, _ = drafts_tensor(drafts)
    out = verify_exact(target, draft_ids, num_draft)
    assert out.num_accepted.tolist() == keep
    got = [row[: n + 1] for row, n in zip(out.output_token_ids.tolist(), keep)]
    assert got == expected
