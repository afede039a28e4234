"""Sorts a step's (token, expert) pairs by expert into row blocks of one expert each, with torch
ops on the device (no host sync, so a CUDA graph can capture it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minivllm.kernels.checks import check_tensor


@dataclass(frozen=True)
class ExpertBlocks:
    """The pairs of a step grouped by expert, each expert's run padded to a multiple of
    block_m. Pair p is (token p // top_k, its (p % top_k)-th expert)."""

    # [max_padded] int32: pair ids, expert by expert, ascending within an expert; padding
    # rows hold num_pairs (out of range: the kernels mask them).
    pair_ids: torch.Tensor
    # [max_padded // block_m] int32: the expert of each row block; num_experts past the end.
    block_experts: torch.Tensor
    # [1] int32: rows in use (the padded total); blocks at or past it are skipped.
    num_padded: torch.Tensor
    num_pairs: int
    block_m: int


def max_padded_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    """An upper bound on the padded rows, known from shapes alone: each used expert adds at
    most block_m - 1 rows of padding, and at most min(num_pairs, num_experts) are used."""
    used = min(num_pairs, num_experts)
    bound = num_pairs + used * (block_m - 1)
    return -(-bound // block_m) * block_m


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertBlocks:
    """topk_ids: [num_tokens, top_k] integer expert ids in [0, num_experts) -> ExpertBlocks.

    A stable sort keeps each expert's pairs in pair order, so a row block's rows, and with
    them every result, do not depend on how the sort breaks ties."""
    check_tensor("topk_ids", topk_ids, 2, (torch.int32, torch.int64))
    device = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    num_pairs = flat.numel()
    sorted_ids, order = torch.sort(flat, stable=True)
    experts = torch.arange(num_experts + 1, device=device)
    # starts[e]: first sorted position of expert e (searchsorted, not bincount: no sync).
    starts = torch.searchsorted(sorted_ids, experts)
    counts = starts[1:] - starts[:-1]
    padded = (counts + block_m - 1) // block_m * block_m
    padded_ends = torch.cumsum(padded, 0)
    padded_starts = padded_ends - padded
    rank = torch.arange(num_pairs, device=device) - starts[sorted_ids]
    dest = padded_starts[sorted_ids] + rank
    max_rows = max_padded_rows(num_pairs, num_experts, block_m)
    pair_ids = torch.full((max_rows,), num_pairs, dtype=torch.int32, device=device)
    pair_ids.scatter_(0, dest, order.to(torch.int32))
    block_starts = torch.arange(0, max_rows, block_m, device=device)
    block_experts = torch.searchsorted(padded_ends, block_starts, right=True)
    return ExpertBlocks(
        pair_ids=pair_ids,
        block_experts=block_experts.to(torch.int32),
        num_padded=padded_ends[-1:].to(torch.int32),
        num_pairs=num_pairs,
        block_m=block_m,
    )
