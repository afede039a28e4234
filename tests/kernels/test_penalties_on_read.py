"""Penalties applied as the filter and draw kernels read the logits (kernels/penalties.py's
RowPenalties) give what the penalized float32 copy gives: the same thresholds, bit for bit,
and the same tokens; rows without a slot are read as they are."""

from __future__ import annotations

import math

import pytest
import torch
from paged_case import DEVICE

from minivllm.kernels import filter_thresholds as kernel
from minivllm.kernels.penalties import (
    RowPenalties,
    apply_penalties_from_tables,
    row_penalty_args,
)
from minivllm.kernels.sampling import sample_plain
from minivllm.layers.sampling_filters import keep_thresholds
from tests.kernels.test_penalties_kernel import make_case

DRAW = 1 << 32
# float32 and float16 in Triton's interpreter; bfloat16 (the models' logits) on the GPU.
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def penalized_case(dtype: torch.dtype, num_rows: int, vocab: int, seed: int = 0):
    """(logits [num_rows, vocab] in dtype, RowPenalties on DEVICE with rows 1 and 4 without a
    slot, the penalized float32 copy as apply_penalties_from_tables leaves it). Logits are
    coarse (ties), the tables narrower than the vocabulary (ids past them unseen)."""
    logits, counts, prompt, rep, freq, pres = make_case(num_rows, vocab, vocab - 9, 4, seed)
    # Penalties that move logits past each other: every seen token's logit changes a lot.
    rep, freq, pres = rep * 2, freq * 2, pres * 2
    logits = ((logits * 4).round() / 4).to(dtype)
    row_slots = torch.tensor([2, -1, 0, 3, -1, 1][:num_rows])
    # Each penalized row's slot has its 8 largest logits within the tables in the prompt, the
    # next 8 in the output: the penalties reorder the top of the row.
    for row, slot in enumerate(row_slots.tolist()):
        if slot >= 0:
            top = logits[row, : vocab - 9].float().topk(16).indices
            prompt[slot, top[:8]] = True
            counts[slot, top[8:]] = 2
    rows = torch.nonzero(row_slots >= 0).flatten()
    tables = [t.to(DEVICE) for t in (counts, prompt, rep, freq, pres)]
    counts, prompt, rep, freq, pres = tables
    copy = apply_penalties_from_tables(
        logits.to(DEVICE, torch.float32, copy=True), rows.to(DEVICE),
        row_slots[rows].to(DEVICE), counts, prompt, rep, freq, pres,
    )  # fmt: skip
    penalties = RowPenalties(row_slots.to(DEVICE), counts, prompt, rep, freq, pres)
    return logits.to(DEVICE), penalties, copy


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [4, None])
def test_thresholds_equal_the_penalized_copys(dtype, group) -> None:
    # group 4: stage 1 picks groups by their maxima (a penalized row's are float32 values
    # even where the logits are 16-bit); None: chunks of 64 sorted whole. Several chunks.
    chunk = 64 * (group or 1)
    logits, penalties, copy = penalized_case(dtype, 6, 2 * chunk + 37)
    temperature = torch.tensor([0.7, 1.0, 0.5, 1.0, 0.0, 1.3], device=DEVICE)
    top_k = torch.tensor([20, 5, 32, 1, 20, 32], device=DEVICE)
    top_p = torch.tensor([0.8, 0.99, 1.0, 0.5, 0.9, 0.3], device=DEVICE)
    min_p = torch.tensor([0.0, 0.0, 0.1, 0.0, 0.0, 0.05], device=DEVICE)
    args = (temperature, top_k, top_p, min_p, 32)
    got = kernel.filter_thresholds(logits, *args, chunk=chunk, group=group, penalties=penalties)
    expected = kernel.filter_thresholds(copy, *args, chunk=chunk, group=group)
    reference = keep_thresholds(copy.cpu(), *(a.cpu() for a in args[:4]), 32, True)
    assert torch.equal(got.cpu(), expected.cpu())
    assert torch.equal(got.cpu(), reference)
    # The penalties moved the thresholds of the penalized rows (the case is not trivial).
    plain = kernel.filter_thresholds(logits, *args, chunk=chunk, group=group)
    assert not torch.equal(plain[[0, 2, 3, 5]].cpu(), got[[0, 2, 3, 5]].cpu())
    assert torch.equal(plain[[1, 4]].cpu(), got[[1, 4]].cpu())


def test_ties_counted_past_the_candidates_are_penalized_too() -> None:
    # Chunk 0: 64 tokens at 3.0, 30 of them in the prompt (repetition 2: 1.5), so 34 stay
    # tied at the k-th (top_k 2), 2 past the chunk's 32 candidates; the top token's weight
    # is 45 ties'. top_p 0.5 keeps the ties only if they are more than 45: read penalized
    # (34) it keeps the top token alone; read raw (64) it would keep them.
    vocab, chunk = 4 * 64, 64
    logits = torch.full((1, vocab), -5.0)
    logits[0, :64] = 3.0
    logits[0, 100] = 3.0 + math.log(45)
    prompt = torch.zeros(1, vocab, dtype=torch.bool)
    prompt[0, :30] = True
    counts = torch.zeros(1, vocab, dtype=torch.int32)
    one = torch.ones(1)
    penalties = RowPenalties(*(t.to(DEVICE) for t in (
        torch.tensor([0]), counts, prompt, one * 2, one * 0, one * 0)))  # fmt: skip
    args = [t.to(DEVICE) for t in (one, torch.tensor([2]), one * 0.5)] + [None, 2]
    got = kernel.filter_thresholds(logits.to(DEVICE), *args, chunk=chunk, penalties=penalties)
    penalized = logits.clone()
    penalized[0, :30] = 1.5
    expected = keep_thresholds(penalized, *(a if a is None or isinstance(a, int) else a.cpu()
                                            for a in args), True)  # fmt: skip
    assert got.item() == expected.item() == logits[0, 100].item()
    raw = kernel.filter_thresholds(logits.to(DEVICE), *args, chunk=chunk)
    assert raw.item() == 3.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_draws_equal_the_penalized_copys(dtype) -> None:
    # Greedy (row 4, no slot; row 2, penalized at T = 0) and random rows, with and without
    # thresholds: the keyed noise of each row is the same, so are its tokens.
    logits, penalties, copy = penalized_case(dtype, 6, 400, seed=1)
    temperature = torch.tensor([0.7, 1.0, 0.0, 1.3, 0.0, 0.5], device=DEVICE)
    seeds = torch.arange(1, 7, device=DEVICE)
    for trial in range(2):
        offsets = (torch.arange(6, device=DEVICE) + 6 * trial) * DRAW
        thresholds = None
        if trial % 2:
            thresholds = kernel.filter_thresholds(
                copy, temperature, torch.full((6,), 32, device=DEVICE), None, None, 32,
                chunk=64,
            )  # fmt: skip
        got = sample_plain(logits, temperature, seeds, offsets, block=128,
                           thresholds=thresholds, penalties=penalties)  # fmt: skip
        expected = sample_plain(copy, temperature, seeds, offsets, block=128,
                                thresholds=thresholds)  # fmt: skip
        assert got.tolist() == expected.tolist()
    assert got[2] == copy[2].argmax() and got[4] == logits[4].float().argmax()
    # The penalties move some penalized row's top token (the case is not trivial).
    penalized = [0, 2, 3, 5]
    assert (copy[penalized].argmax(1) != logits[penalized].float().argmax(1)).any()


def test_row_penalties_are_checked() -> None:
    logits, penalties, _ = penalized_case(torch.float32, 6, 100)
    ones = torch.ones(6, device=DEVICE)
    keys = torch.zeros(6, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="row_slots.shape"):
        sample_plain(logits, ones, keys, keys, penalties=penalties._replace(
            row_slots=penalties.row_slots[:5]))  # fmt: skip
    with pytest.raises(ValueError, match="repetition has dtype"):
        kernel.filter_thresholds(logits, ones, None, None, None, 0, penalties=penalties._replace(
            repetition=penalties.repetition.double()))  # fmt: skip


def test_steps_without_penalties_pass_pointers_of_the_same_types() -> None:
    # A pointer's element type is part of a Triton variant: stand-ins of other types made the
    # first penalized step compile the filter kernels again, mid-run, on the GPU.
    logits, penalties, _ = penalized_case(torch.float32, 6, 100)
    temperature = torch.ones(6, device=DEVICE)
    real = row_penalty_args(penalties, 6, temperature)
    stand_ins = row_penalty_args(None, 6, temperature)
    assert len(real) == len(stand_ins)
    for got, want in zip(stand_ins, real, strict=True):
        assert type(got) is type(want)
        if isinstance(want, torch.Tensor):
            assert got.dtype == want.dtype and got.device == want.device
