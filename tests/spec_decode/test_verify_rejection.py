"""Rejection sampling: the output token at each position is distributed as the target's p
whatever the draft's q (a draft model's q or ngram's one-hot); greedy rows reduce to exact."""

from __future__ import annotations

import torch

from minivllm.spec_decode.verify import verify_exact, verify_rejection

VOCAB = 8
# chi-square with VOCAB - 1 = 7 degrees of freedom exceeds this with probability 1e-4.
CHI2_LIMIT = 29.9


def chi_square(tokens: torch.Tensor, p: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=VOCAB).double()
    expected = p.double() * tokens.numel()
    return float(((counts - expected) ** 2 / expected).sum())


def random_probs(generator: torch.Generator, rows: int) -> torch.Tensor:
    # Gamma-ish spread: some tokens likely, some rare (none zero, so chi-square is defined).
    weights = torch.rand(rows, VOCAB, generator=generator) ** 3 + 0.01
    return weights / weights.sum(-1, keepdim=True)


def test_output_is_distributed_as_p_for_a_draft_model():
    gen = torch.Generator().manual_seed(0)
    n, k = 40_000, 2
    p = random_probs(gen, k + 1)  # the target's p at positions 0, 1 and the bonus position
    q = random_probs(gen, k)  # the draft's q at positions 0, 1
    drafts = torch.stack([torch.multinomial(q[j], n, True, generator=gen) for j in range(k)], 1)
    out = verify_rejection(
        p.repeat(n, 1),  # [n * (k + 1), V]: every request sees the same p
        drafts,
        torch.full((n,), k),
        draft_probs=q.expand(n, k, VOCAB),
        generator=gen,
    )
    assert chi_square(out.output_token_ids[:, 0], p[0]) < CHI2_LIMIT
    # A draft at position 1 follows one at 0 independently here, so position 1 is p[1] too.
    second = out.output_token_ids[out.num_accepted >= 1, 1]
    assert chi_square(second, p[1]) < CHI2_LIMIT
    bonus = out.output_token_ids[out.num_accepted == k, k]
    assert bonus.numel() > 1000 and chi_square(bonus, p[k]) < CHI2_LIMIT
    # Acceptance at position 0 happens with probability sum_x min(p, q).
    rate = float((out.num_accepted >= 1).double().mean())
    assert abs(rate - float(torch.minimum(p[0], q[0]).sum())) < 0.01


def test_ngram_one_hot_draft_keeps_p():
    """q one-hot at the draft x: x is kept with probability p(x), else p without x is drawn."""
    gen = torch.Generator().manual_seed(1)
    n = 40_000
    p = random_probs(gen, 2)
    drafts = torch.full((n, 1), int(p[0].argmin()))  # an unlikely draft
    out = verify_rejection(p.repeat(n, 1), drafts, torch.ones(n, dtype=torch.int64), generator=gen)
    assert chi_square(out.output_token_ids[:, 0], p[0]) < CHI2_LIMIT
    rate = float(out.num_accepted.double().mean())
    assert abs(rate - float(p[0].min())) < 0.005


def test_draft_equal_to_target_is_always_accepted():
    gen = torch.Generator().manual_seed(2)
    p = random_probs(gen, 4)
    drafts = torch.stack([torch.multinomial(p[j], 1, generator=gen) for j in range(3)], 1)
    out = verify_rejection(p, drafts, torch.tensor([3]), draft_probs=p[None, :3], generator=gen)
    assert out.num_accepted.tolist() == [3]
    assert out.output_token_ids[0, :3].tolist() == drafts[0].tolist()


def test_greedy_rows_reduce_to_exact_and_ragged_k():
    gen = torch.Generator().manual_seed(3)
    num_draft = torch.tensor([2, 0, 1, 2])
    p = random_probs(gen, int((num_draft + 1).sum()))
    argmax = p.argmax(-1)
    # Row 0 drafts the argmax chain, row 3 gets its first draft wrong.
    drafts = torch.tensor([[argmax[0], argmax[1]], [-1, -1], [5, -1], [(argmax[6] + 1) % 8, 0]])
    is_greedy = torch.tensor([True, True, False, True])
    out = verify_rejection(p, drafts, num_draft, is_greedy=is_greedy, generator=gen)
    exact = verify_exact(argmax, drafts, num_draft)
    for row in (0, 1, 3):
        assert out.output_token_ids[row].tolist() == exact.output_token_ids[row].tolist()
    assert out.num_accepted.tolist()[:2] == [2, 0] and out.num_accepted[3] == 0
    assert out.output_token_ids.shape == (4, 3)
    assert out.output_token_ids[1, 1:].tolist() == [-1, -1]
    assert 0 <= int(out.num_accepted[2]) <= 1
