"""Tensor-parallel rank and size, plus the collectives the layers need (NCCL, or gloo on the CPU).

TP spans the default torch.distributed group; without one initialized we are rank 0 of 1.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def get_tp_rank_size() -> tuple[int, int]:
    """(tp_rank, tp_size) from torch.distributed, or (0, 1) when it is not initialized."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce(x: torch.Tensor, tp_size: int) -> torch.Tensor:
    """Sums x over the TP ranks, in place; a no-op at tp_size 1."""
    if tp_size > 1:
        dist.all_reduce(x)
    return x


def all_reduce_ordered(x: torch.Tensor, tp_size: int) -> torch.Tensor:
    """Sums x over the TP ranks as ((x_0 + x_1) + x_2) + ... in float32, then rounds to
    x.dtype: the same bits on every rank for any message size (deterministic mode). NCCL's
    all_reduce fixes no order (its algorithm, protocol and chunking follow the message size)."""
    if tp_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(tp_size)]
    dist.all_gather(parts, x.contiguous())
    total = parts[0].float()
    for part in parts[1:]:
        total += part
    return total.to(x.dtype)


def all_gather_last_dim(x: torch.Tensor, tp_size: int) -> torch.Tensor:
    """Concatenates every rank's x along the last dim, in rank order."""
    if tp_size == 1:
        return x
    # One flat gather [tp, ..., n], then one copy into [..., tp * n]: a list all_gather
    # gathers flat too, then copies into each part, then cat copies again.
    x = x.contiguous()
    gathered = torch.empty((tp_size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    # all_gather_into_tensor was renamed all_gather_single (torch 2.13).
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(gathered, x)
    gathered = gathered.view(tp_size, *x.shape).movedim(0, -2)
    return gathered.reshape(*x.shape[:-1], tp_size * x.shape[-1])


def divide(numerator: int, denominator: int, what: str) -> int:
    """numerator // denominator, or a ValueError naming both numbers."""
    if numerator % denominator != 0:
        raise ValueError(
            f"{what} ({numerator}) is not divisible by tensor_parallel_size ({denominator})"
        )
    return numerator // denominator
