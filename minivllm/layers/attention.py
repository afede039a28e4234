"""The attention layer: owns its slice of the paged KV cache and calls the backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from minivllm.attention.base import AttentionBackend, AttnMetadata

if TYPE_CHECKING:
    from minivllm.kernels.kv_store import KVWrite


class Attention(nn.Module):
    """Paged attention for one layer. The runner binds `kv_cache` after allocating it."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        backend: AttentionBackend,
        kv_written_by_rope: bool = False,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.backend = backend
        # [2, num_blocks, block_size, num_kv_heads, head_dim]; empty until the runner binds it.
        self.kv_cache = torch.empty(0)
        # Dequantization scales of an fp8 cache (it holds K / k_scale, V / v_scale); 1.0 as in
        # vLLM when the checkpoint has none (docs/kernels.md, "FP8 KV cache").
        self.k_scale = 1.0
        self.v_scale = 1.0
        # True on the Triton path: the RoPE kernel writes this step's K/V into kv_cache
        # (kernels/rope.py, with kv_write() as its target), so the backend does not.
        self.kv_written_by_rope = kv_written_by_rope

    def kv_write(self, v: torch.Tensor, slot_mapping: torch.Tensor) -> KVWrite:
        """Where the RoPE kernel writes K and v [num_tokens, num_kv_heads * head_dim]."""
        from minivllm.kernels.kv_store import KVWrite  # Triton path only

        v = v.view(-1, self.num_kv_heads, self.head_dim)
        return KVWrite(v, self.kv_cache, slot_mapping, self.k_scale, self.v_scale)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttnMetadata,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # q, out: [num_tokens, num_heads * head_dim]; k, v: [num_tokens, num_kv_heads * head_dim]
        # out (contiguous rows): where to write the result (the piecewise graphs' static
        # buffer), else a new tensor.
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if out is not None:
            out = out.view(-1, self.num_heads, self.head_dim)
        out = self.backend.forward(
            q, k, v, self.kv_cache, meta, self.scale, self.k_scale, self.v_scale, out,
            write_kv=not self.kv_written_by_rope,
        )  # fmt: skip
        return out.reshape(-1, self.num_heads * self.head_dim)
