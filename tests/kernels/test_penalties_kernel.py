"""The penalties kernel against its torch definition (layers/penalties.py), drafts included."""

from __future__ import annotations

import pytest
import torch
from paged_case import DEVICE

from minivllm.kernels.penalties import apply_penalties_from_tables
from minivllm.layers.penalties import penalize


def make_case(num_rows: int, vocab: int, width: int, num_slots: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_rows, vocab, generator=gen) * 3
    counts = torch.randint(0, 3, (num_slots, width), generator=gen, dtype=torch.int32)
    counts *= torch.rand(num_slots, width, generator=gen) < 0.2
    prompt = torch.rand(num_slots, width, generator=gen) < 0.1
    repetition = 0.5 + torch.rand(num_rows, generator=gen)
    frequency = torch.randn(num_rows, generator=gen)
    presence = torch.randn(num_rows, generator=gen)
    return logits, counts, prompt, repetition, frequency, presence


@pytest.mark.parametrize("with_drafts", [False, True])
def test_kernel_equals_torch_definition(with_drafts: bool) -> None:
    # Vocab past the tables' width (ids beyond count as unseen) and several vocab blocks.
    vocab, width = 300, 280
    logits, counts, prompt, rep, freq, pres = make_case(5, vocab, width, num_slots=4)
    rows = torch.tensor([4, 0, 2])  # penalized rows, out of order; rows 1 and 3 untouched
    slots = torch.tensor([1, 3, 0])
    drafts = None
    if with_drafts:
        drafts = torch.tensor([[7, 7], [299, -1], [-1, -1]])
    args = (rows, slots, counts, prompt, rep, freq, pres)
    expected = penalize(logits.clone(), *args, drafts=drafts)
    on_device = [a.to(DEVICE) for a in args]
    got = apply_penalties_from_tables(
        logits.clone().to(DEVICE),
        *on_device,
        drafts=None if drafts is None else drafts.to(DEVICE),
        block=128,
    )
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    assert torch.equal(expected[[1, 3]], logits[[1, 3]])
    assert not torch.equal(expected[[0, 2, 4]], logits[[0, 2, 4]])


def test_definition_is_vllms_arithmetic() -> None:
    # One row written out: repetition divides positive logits of seen tokens (prompt or
    # output) and multiplies negative ones; frequency counts output; presence marks it.
    logits = torch.tensor([[2.0, -2.0, 1.0, 4.0]])
    counts = torch.tensor([[0, 2, 0, 0]], dtype=torch.int32)
    prompt = torch.tensor([[True, False, False, False]])
    out = penalize(
        logits.clone(), torch.tensor([0]), torch.tensor([0]), counts, prompt,
        torch.tensor([2.0]), torch.tensor([0.5]), torch.tensor([0.25]),
        drafts=torch.tensor([[2]]),
    )  # fmt: skip
    # id 0: prompt -> 2/2; id 1: output x2 -> -2*2 - 0.5*2 - 0.25; id 2: a draft -> 1/2 - 0.5
    # - 0.25; id 3: unseen.
    assert out.tolist() == [[1.0, -5.25, -0.25, 4.0]]
