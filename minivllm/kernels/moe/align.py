"""Sorts a step's (token, expert) pairs by expert into row blocks of one expert each, in one
launch without a host sync (a CUDA graph can capture it) and without atomics (the order of a
block's rows is fixed: each expert's pairs in pair order)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_tensor

CHUNK = 1024  # pair ids a program reads at a time


@dataclass(frozen=True)
class ExpertBlocks:
    """The pairs of a step grouped by expert, each expert's run padded to a multiple of
    block_m. Pair p is (token p // top_k, its (p % top_k)-th expert). Rows and blocks at or
    past num_padded are never read (their programs exit) and hold garbage."""

    # [max_padded] int32: pair ids, expert by expert, ascending within an expert; padding
    # rows hold num_pairs (out of range: the kernels mask them).
    pair_ids: torch.Tensor
    block_experts: torch.Tensor  # [max_padded // block_m] int32: the expert of each row block
    num_padded: torch.Tensor  # [1] int32: rows in use (the padded total)
    num_pairs: int
    block_m: int


@triton.jit(do_not_specialize=["num_pairs"])
def _align_kernel(
    ids_ptr, pair_ids_ptr, block_experts_ptr, num_padded_ptr, num_pairs,
    NUM_EXPERTS: tl.constexpr, BINS: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """Grid (num_experts,): program e places expert e's pairs. Each program counts every
    expert's pairs (a histogram over all ids: no second launch, no atomics) to find where
    e's padded run starts, then writes e's pair ids in pair order, its padding rows and its
    blocks' expert; the last program writes the padded total."""
    e = tl.program_id(0)
    offs = tl.arange(0, CHUNK)
    counts = tl.zeros([BINS], tl.int32)
    for start in range(0, num_pairs, CHUNK):
        # Rows past the end count in bin NUM_EXPERTS, which no expert reads.
        ids = tl.load(ids_ptr + start + offs, mask=start + offs < num_pairs, other=NUM_EXPERTS)
        counts += tl.histogram(ids, BINS)
    bins = tl.arange(0, BINS)
    padded = tl.where(bins < NUM_EXPERTS, (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M, 0)
    run_start = tl.sum(tl.where(bins < e, padded, 0))
    count = tl.sum(tl.where(bins == e, counts, 0))
    run_rows = tl.sum(tl.where(bins == e, padded, 0))
    seen = e * 0  # pairs of e placed so far (an int32 tensor: a loop-carried value)
    for start in range(0, num_pairs, CHUNK):
        ids = tl.load(ids_ptr + start + offs, mask=start + offs < num_pairs, other=NUM_EXPERTS)
        mine = (ids == e).to(tl.int32)
        rank = seen + tl.cumsum(mine, 0) - 1
        tl.store(pair_ids_ptr + run_start + rank, start + offs, mask=mine != 0)
        seen += tl.sum(mine)
    pad = tl.arange(0, BLOCK_M)
    tl.store(pair_ids_ptr + run_start + count + pad, tl.full([BLOCK_M], 0, tl.int32) + num_pairs,
             mask=pad < run_rows - count)  # fmt: skip
    first_block = run_start // BLOCK_M
    for b in range(0, run_rows // BLOCK_M, CHUNK):
        blocks = b + offs
        tl.store(block_experts_ptr + first_block + blocks, tl.full([CHUNK], 0, tl.int32) + e,
                 mask=blocks < run_rows // BLOCK_M)  # fmt: skip
    if e == NUM_EXPERTS - 1:
        tl.store(num_padded_ptr, tl.sum(padded))


def max_padded_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    """An upper bound on the padded rows, known from shapes alone: each used expert adds at
    most block_m - 1 rows of padding, and at most min(num_pairs, num_experts) are used."""
    used = min(num_pairs, num_experts)
    bound = num_pairs + used * (block_m - 1)
    return -(-bound // block_m) * block_m


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertBlocks:
    """topk_ids: [num_tokens, top_k] int32 expert ids in [0, num_experts) -> ExpertBlocks.
    An id out of range is not checked (that would need a host sync): the router makes them."""
    check_tensor("topk_ids", topk_ids, 2, (torch.int32,))
    device = topk_ids.device
    num_pairs = topk_ids.numel()
    max_rows = max_padded_rows(num_pairs, num_experts, block_m)
    pair_ids = torch.empty(max_rows, dtype=torch.int32, device=device)
    block_experts = torch.empty(max_rows // block_m, dtype=torch.int32, device=device)
    num_padded = torch.zeros(1, dtype=torch.int32, device=device)
    if num_pairs:
        _align_kernel[(num_experts,)](
            topk_ids.contiguous(), pair_ids, block_experts, num_padded, num_pairs,
            NUM_EXPERTS=num_experts, BINS=triton.next_power_of_2(num_experts + 1),
            BLOCK_M=block_m, CHUNK=CHUNK, num_warps=4,
        )  # fmt: skip
    return ExpertBlocks(pair_ids, block_experts, num_padded, num_pairs, block_m)
