"""Deterministic mode for the model's matmuls: every linear layer and the LM head use the
batch-invariant GEMM, and row-parallel partial sums are added in rank order
(docs/determinism.md). The runner applies it once, right after building the model."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def all_reduce_ordered(x: torch.Tensor, tp_size: int) -> torch.Tensor:
    """Sums x over the TP ranks as ((x_0 + x_1) + x_2) + ... in float32, then rounds to
    x.dtype: the same bits on every rank for any message size. NCCL's all_reduce fixes no
    order (its algorithm, protocol and chunking follow the message size)."""
    if tp_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(tp_size)]
    dist.all_gather(parts, x.contiguous())
    total = parts[0].float()
    for part in parts[1:]:
        total += part
    return total.to(x.dtype)


def use_batch_invariant_ops(model: nn.Module) -> int:
    """Points every linear layer and LM head of `model` at the batch-invariant GEMM and every
    row-parallel layer at the ordered all-reduce; returns how many layers it switched."""
    from minivllm.kernels.matmul import matmul
    from minivllm.layers.embedding import ParallelLMHead
    from minivllm.layers.linear import LinearBase, RowParallelLinear

    switched = 0
    for module in model.modules():
        if isinstance(module, (LinearBase, ParallelLMHead)):
            module.gemm = matmul
            switched += 1
        if isinstance(module, RowParallelLinear):
            module.reduce = all_reduce_ordered
    return switched
