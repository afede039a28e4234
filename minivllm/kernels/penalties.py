"""Repetition, frequency and presence penalties from per-request tables on the device.

Each penalized row reads its request's slot of two tables that live across steps: whether a
token occurs in the prompt and how often it occurs in the output. Nothing is built per step
but the rows' slot indices, so the cost does not grow with prompt or output length.

Two ways in: apply_penalties_from_tables penalizes a float32 copy of the logits in place, and
RowPenalties hands the same tables to the filter and draw kernels (filter_thresholds.py,
sampling.py), which penalize each logit as they read it (penalized_on_read): no copy of the
logits, no pass of their own. Both use _penalized's arithmetic.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_same, check_tensor

DEFAULT_BLOCK = 2048


class RowPenalties(NamedTuple):
    """The penalties the filter and draw kernels apply as they read a step's logits [N, V].

    row_slots: [N] int64, each row's slot of the tables (-1: the row is not penalized);
    output_counts: [S, W] int32 and prompt_mask: [S, W] bool (ids >= W count as unseen);
    repetition, frequency, presence: [N] float32 per row.
    """

    row_slots: torch.Tensor
    output_counts: torch.Tensor
    prompt_mask: torch.Tensor
    repetition: torch.Tensor
    frequency: torch.Tensor
    presence: torch.Tensor


def row_penalty_args(
    penalties: RowPenalties | None, num_rows: int, stand_in: torch.Tensor, typed: bool = True
) -> tuple:
    """The kernels' penalty arguments (row_slots, counts, prompt, rep, freq, pres pointers,
    stride_table, table_width) from penalties, checked against num_rows. With None, stand-ins
    that a kernel told that no row is penalized never reads: stand_in (float32, on the device)
    for each, but with typed, empty tensors of the real pointers' dtypes (a pointer's type is
    part of a Triton variant: then one variant serves steps with penalties and without)."""
    if penalties is None:
        pointers = [stand_in] * 3
        if typed:
            pointers = [torch.empty(0, dtype=dtype, device=stand_in.device)
                        for dtype in (torch.int64, torch.int32, torch.uint8)]  # fmt: skip
        return (*pointers, stand_in, stand_in, stand_in, 0, 0)
    p = penalties
    check_tensor("row_slots", p.row_slots, 1, (torch.int64,))
    check_tensor("output_counts", p.output_counts, 2, (torch.int32,))
    check_tensor("prompt_mask", p.prompt_mask, 2, (torch.bool,))
    check_same("output_counts.shape", p.output_counts.shape, "prompt_mask.shape",
               p.prompt_mask.shape)  # fmt: skip
    check_same("output_counts.stride", p.output_counts.stride(), "prompt_mask.stride",
               p.prompt_mask.stride())  # fmt: skip
    for name in ("row_slots", "repetition", "frequency", "presence"):
        t = getattr(p, name)
        if name != "row_slots":
            check_tensor(name, t, 1, (torch.float32,))
        check_same(f"{name}.shape[0]", t.shape[0], "num_rows", num_rows)
    return (
        p.row_slots, p.output_counts, p.prompt_mask.view(torch.uint8), p.repetition,
        p.frequency, p.presence, p.output_counts.stride(0), p.output_counts.shape[1],
    )  # fmt: skip


@triton.jit
def _penalized(x, count, in_prompt, repetition, frequency, presence):
    """x (float32) under a row's penalties: repetition divides positive logits of tokens seen
    (prompt or output) and multiplies negative ones, frequency subtracts per output occurrence,
    presence once per token in the output (layers/penalties.py's order)."""
    seen = (count > 0) | (in_prompt != 0)
    repetition = tl.where(seen, repetition, 1.0)
    # IEEE division, as torch's: the fast default would differ from the CPU path in the last bit.
    x = tl.where(x > 0, tl.math.div_rn(x, repetition), x * repetition)
    x = x - frequency * count.to(tl.float32)
    return x - presence * (count > 0).to(tl.float32)


@triton.jit
def penalized_on_read(x, ids, row, slot, counts_ptr, prompt_ptr, rep_ptr, freq_ptr, pres_ptr,
                      stride_table, table_width):  # fmt: skip
    """x: float32 logits of row `row` at ids (any shape), penalized from table slot `slot`
    (>= 0): what apply_penalties_from_tables leaves there."""
    in_table = ids < table_width
    table = slot * stride_table + ids
    count = tl.load(counts_ptr + table, mask=in_table, other=0)
    in_prompt = tl.load(prompt_ptr + table, mask=in_table, other=0)
    return _penalized(x, count, in_prompt, tl.load(rep_ptr + row), tl.load(freq_ptr + row),
                      tl.load(pres_ptr + row))  # fmt: skip


@triton.jit
def row_slot(row_slots_ptr, row, has_penalties):
    """The row's table slot, -1 where no row is penalized (has_penalties 0: nothing read)."""
    slot = tl.full([], -1, tl.int64)
    if has_penalties != 0:
        slot = tl.load(row_slots_ptr + row).to(tl.int64)  # any stand-in's type compiles
    return slot


# The per-step pointers sit at any offset of the step's upload (drafts_ptr is rows_ptr without
# drafts): specializing on their alignment would compile again mid-serving.
@triton.jit(do_not_specialize_on_alignment=["rows_ptr", "slots_ptr", "rep_ptr", "freq_ptr",
                                            "pres_ptr", "drafts_ptr"])  # fmt: skip
def _penalties_kernel(
    logits_ptr, rows_ptr, slots_ptr, counts_ptr, prompt_ptr, rep_ptr, freq_ptr, pres_ptr,
    drafts_ptr, stride_logits, stride_table, stride_drafts, vocab_size, table_width,
    NUM_DRAFTS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Grid (num_penalized, cdiv(vocab_size, BLOCK)): one vocab chunk of one penalized row."""
    i = tl.program_id(0).to(tl.int64)
    ids = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(rows_ptr + i)
    slot = tl.load(slots_ptr + i)
    in_vocab = ids < vocab_size
    in_table = ids < table_width
    logits_row = logits_ptr + row * stride_logits
    x = tl.load(logits_row + ids, mask=in_vocab, other=0.0)
    count = tl.load(counts_ptr + slot * stride_table + ids, mask=in_table, other=0)
    # Drafts before this row's position count as output (speculative decoding).
    for j in tl.static_range(NUM_DRAFTS):
        draft = tl.load(drafts_ptr + i * stride_drafts + j)
        count += (ids == draft).to(tl.int32)
    in_prompt = tl.load(prompt_ptr + slot * stride_table + ids, mask=in_table, other=0)
    x = _penalized(x, count, in_prompt, tl.load(rep_ptr + row), tl.load(freq_ptr + row),
                   tl.load(pres_ptr + row))  # fmt: skip
    tl.store(logits_row + ids, x, mask=in_vocab)


def apply_penalties_from_tables(
    logits: torch.Tensor,
    rows: torch.Tensor,
    slots: torch.Tensor,
    output_counts: torch.Tensor,
    prompt_mask: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    drafts: torch.Tensor | None = None,
    block: int = DEFAULT_BLOCK,
) -> torch.Tensor:
    """Penalizes logits rows in place; returns logits.

    logits: [N, V] float32; rows, slots: [P] int64 (penalized rows and their table slots);
    output_counts: [S, W] int32 and prompt_mask: [S, W] bool (ids >= W count as unseen);
    repetition, frequency, presence: [N] float32 per row; drafts: [P, K] int64 ids counted as
    output on top of the table (padded with -1), or None. Grid (P, cdiv(V, block)).
    """
    check_tensor("logits", logits, 2, (torch.float32,))
    check_tensor("output_counts", output_counts, 2, (torch.int32,))
    check_tensor("prompt_mask", prompt_mask, 2, (torch.bool,))
    check_same("output_counts.shape", output_counts.shape, "prompt_mask.shape", prompt_mask.shape)
    check_same("output_counts.stride", output_counts.stride(), "prompt_mask.stride",
               prompt_mask.stride())  # fmt: skip
    num_penalized = rows.shape[0]
    if num_penalized == 0:
        return logits
    num_drafts = 0 if drafts is None else drafts.shape[1]
    if drafts is None:
        drafts = rows  # never read
    vocab_size = logits.shape[1]
    grid = (num_penalized, triton.cdiv(vocab_size, block))
    _penalties_kernel[grid](
        logits, rows, slots, output_counts, prompt_mask.view(torch.uint8), repetition, frequency,
        presence, drafts, logits.stride(0), output_counts.stride(0), drafts.stride(0),
        vocab_size, output_counts.shape[1], NUM_DRAFTS=num_drafts, BLOCK=block,
        num_warps=min(max(block // 512, 1), 8),
    )  # fmt: skip
    return logits
