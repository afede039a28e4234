"""The paged KV cache of one rank: its shape (KVCacheSpec), its allocation (one tensor, one
[2, num_blocks, block_size, kv_heads, head_dim] view per layer) and binding it to the layers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minivllm.engine.runner.cache.cache_memory import cache_zeros
from minivllm.layers.attention import Attention
from minivllm.models.model_config import ModelConfig


@dataclass(frozen=True)
class KVCacheSpec:
    """Everything about one rank's KV cache but its number of blocks."""

    num_layers: int
    block_size: int
    num_kv_heads: int  # on this rank
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def for_model(
        cls,
        model_config: ModelConfig,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        tp_size: int,
    ) -> KVCacheSpec:
        # Fewer KV heads than ranks: each rank keeps one (replicated) head.
        num_kv_heads = max(1, model_config.num_key_value_heads // tp_size)
        return cls(
            model_config.num_kv_layers,
            block_size,
            num_kv_heads,
            model_config.head_dim,
            dtype,
            device,
        )

    @property
    def bytes_per_block(self) -> int:
        """Bytes of K and V for one block across all layers."""
        element_size = torch.empty(0, dtype=self.dtype).element_size()
        per_token = 2 * self.num_kv_heads * self.head_dim * element_size
        return self.num_layers * self.block_size * per_token

    def num_blocks_for(self, budget_bytes: int) -> int:
        return max(0, budget_bytes // self.bytes_per_block)

    def allocate(self, num_blocks: int) -> list[torch.Tensor]:
        """One tensor per layer: [2, num_blocks, block_size, num_kv_heads, head_dim]."""
        shape = (
            self.num_layers,
            2,
            num_blocks,
            self.block_size,
            self.num_kv_heads,
            self.head_dim,
        )
        # Zeros, not empty: padded decode rows of a CUDA graph read block 0 and must not see NaN.
        cache = cache_zeros(shape, self.dtype, self.device)
        return list(cache.unbind(0))


def bind_kv_caches(layers: Sequence[Attention], caches: Sequence[torch.Tensor]) -> None:
    """Gives each attention layer its cache (layer order); empty tensors unbind them."""
    for layer, cache in zip(layers, caches, strict=True):
        layer.kv_cache = cache
