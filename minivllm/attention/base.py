"""AttnMetadata (one per step) and the attention backend protocol.

The model calls `attn(q, k, v, meta)`; the backend writes the new K/V rows into the paged
cache at `slot_mapping` and computes the new queries' attention over their whole context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class AttnMetadata:
    """Describes one step's packed batch for attention.

    Rows of q/k/v are the step's tokens, request after request; the first
    `num_decode_tokens` requests are decodes (query length 1), the rest prefill chunks.
    """

    query_start_loc: torch.Tensor  # [num_seqs + 1] int32, cu_seqlens_q
    seq_lens: torch.Tensor  # [num_seqs] int32, context length including this step's tokens
    block_tables: torch.Tensor  # [num_seqs, max_num_blocks] int32, padded with 0
    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 for padded rows (skipped)
    max_query_len: int
    max_seq_len: int
    num_decode_tokens: int  # == number of decode requests; they come first
    # Host copies, so that a backend never syncs to learn lengths.
    query_start_loc_cpu: list[int] | None = None
    seq_lens_cpu: list[int] | None = None

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]


class AttentionBackend(Protocol):
    """Writes K/V into the paged cache and attends over it."""

    name: str

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttnMetadata,
        scale: float,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        ...
