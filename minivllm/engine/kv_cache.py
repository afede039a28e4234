"""KV cache sizing and allocation: one allocation, one view per layer of shape
[2, num_blocks, block_size, kv_heads, head_dim]."""

from __future__ import annotations

import torch

from minivllm.config import ModelConfig


def num_local_kv_heads(model_config: ModelConfig, tp_size: int) -> int:
    # Fewer KV heads than ranks: each rank keeps one (replicated) head.
    return max(1, model_config.num_key_value_heads // tp_size)


def bytes_per_block(
    model_config: ModelConfig, block_size: int, dtype: torch.dtype, tp_size: int
) -> int:
    """Bytes of K and V for one block across all layers, on one rank."""
    per_token = 2 * num_local_kv_heads(model_config, tp_size) * model_config.head_dim
    element_size = torch.empty(0, dtype=dtype).element_size()
    return model_config.num_hidden_layers * block_size * per_token * element_size


def num_blocks_for_budget(budget_bytes: int, block_bytes: int) -> int:
    return max(0, budget_bytes // block_bytes)


def allocate_kv_caches(
    model_config: ModelConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    tp_size: int,
) -> list[torch.Tensor]:
    """Returns one tensor per layer: [2, num_blocks, block_size, num_kv_heads, head_dim]."""
    shape = (
        model_config.num_hidden_layers,
        2,
        num_blocks,
        block_size,
        num_local_kv_heads(model_config, tp_size),
        model_config.head_dim,
    )
    # Zeros, not empty: padded decode rows of a CUDA graph read block 0 and must not see NaN.
    cache = torch.zeros(shape, dtype=dtype, device=device)
    return list(cache.unbind(0))
