"""The exact-verification kernel against verify_exact's torch definition: accepted counts and
output rows, for drafts all accepted, rejected at each position, rows without drafts, and
random batches."""

from __future__ import annotations

import pytest
import torch
from paged_case import DEVICE

from minivllm.kernels.verify import verify_exact_fused
from minivllm.spec_decode.verify import first_rows, verify_exact


def fused(target: torch.Tensor, drafts: torch.Tensor, num_drafts: torch.Tensor):
    """The kernel on DEVICE, its rows' starts as verify_exact computes them."""
    num_drafts = num_drafts.to(DEVICE)
    return verify_exact_fused(
        target.to(DEVICE), drafts.to(DEVICE), num_drafts, first_rows(num_drafts)
    )


def _check(target: torch.Tensor, drafts: torch.Tensor, num_drafts: torch.Tensor) -> None:
    expected = verify_exact(target, drafts, num_drafts)  # torch, on the CPU
    num_accepted, out = fused(target, drafts, num_drafts)
    assert num_accepted.cpu().tolist() == expected.num_accepted.tolist()
    assert out.cpu().tolist() == expected.output_token_ids.tolist()


def test_hand_made_rows() -> None:
    # Row 0: 3 drafts, all accepted (bonus 13); row 1: none; row 2: rejected at its second
    # draft (the target's 21 there); row 3: rejected at its first.
    drafts = torch.tensor([[10, 11, 12], [-1, -1, -1], [20, 99, -1], [98, -1, -1]])
    num_drafts = torch.tensor([3, 0, 2, 1], dtype=torch.int32)
    target = torch.tensor([10, 11, 12, 13, 50, 20, 21, 22, 30, 31])
    _check(target, drafts, num_drafts)
    num_accepted, out = fused(target, drafts, num_drafts)
    assert num_accepted.tolist() == [3, 0, 1, 0]
    assert out.tolist() == [[10, 11, 12, 13], [50, -1, -1, -1], [20, 21, -1, -1], [30, -1, -1, -1]]


@pytest.mark.parametrize("num_rows, max_drafts", [(1, 1), (5, 4), (9, 16), (3, 40)])
def test_random_batches(num_rows: int, max_drafts: int) -> None:
    generator = torch.Generator().manual_seed(num_rows * 100 + max_drafts)
    num_drafts = torch.randint(0, max_drafts + 1, (num_rows,), generator=generator)
    drafts = torch.full((num_rows, max_drafts), -1, dtype=torch.int64)
    targets = []
    for i, k in enumerate(num_drafts.tolist()):
        row = torch.randint(0, 4, (k + 1,), generator=generator)  # a small vocab: many matches
        drafts[i, :k] = torch.where(torch.rand(k, generator=generator) < 0.8, row[:k], 5)
        targets.append(row)
    _check(torch.cat(targets), drafts, num_drafts)


def test_bad_arguments() -> None:
    target = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="int64"):
        verify_exact_fused(target, torch.zeros(2, 1, dtype=torch.int32, device=DEVICE),
                           torch.ones(2, dtype=torch.int64, device=DEVICE),
                           torch.zeros(2, dtype=torch.int64, device=DEVICE))  # fmt: skip
    with pytest.raises(ValueError, match="num_rows"):
        verify_exact_fused(target, torch.zeros(2, 1, dtype=torch.int64, device=DEVICE),
                           torch.ones(3, dtype=torch.int64, device=DEVICE),
                           torch.zeros(2, dtype=torch.int64, device=DEVICE))  # fmt: skip
