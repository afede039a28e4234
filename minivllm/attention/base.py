"""AttnMetadata (one per step) and the attention backend protocols.

The model calls `attn(q, k, v, meta)`; the backend writes the new K/V rows into the paged
cache at `slot_mapping` and computes the new queries' attention over their whole context.
A backend that can run inside CUDA graphs also owns the static metadata buffers they read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from minivllm.layers.gated_delta_net import GatedDeltaMeta


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
    max_seq_len: int
    num_decode_tokens: int  # == number of decode requests; they come first
    # Host copies, so that a backend that loops over requests never syncs to learn lengths.
    query_start_loc_cpu: np.ndarray | None = None
    seq_lens_cpu: np.ndarray | None = None
    # [num_decode_tokens] int32: the decode requests, longest context first (stable), the
    # order in which the decode kernel starts their programs; None: row order.
    decode_order: torch.Tensor | None = None
    # Hybrid models: where the Gated DeltaNet layers find each row's recurrent state (the
    # same rows, decodes first); None for a model without them.
    linear_attn: GatedDeltaMeta | None = None

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]


class AttentionBackend(Protocol):
    """Writes K/V into the paged cache and attends over it."""

    name: str
    # Whether forward() of a decode-only batch can be captured in a CUDA graph; if so the
    # backend is also a CUDAGraphBackend.
    supports_cuda_graphs: bool

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttnMetadata,
        scale: float,
        # kv_cache_dtype="fp8": the cache holds K / k_scale and V / v_scale (e4m3); else 1.0.
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        out: torch.Tensor | None = None,  # written and returned when given
        # False: this step's K/V are in the cache already (the Triton RoPE wrote them).
        write_kv: bool = True,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        ...


class CUDAGraphBackend(AttentionBackend, Protocol):
    """A backend whose decode path can be captured: it owns the static metadata buffers that
    the captured graphs read, and copies each replayed batch's metadata into them."""

    def init_graph_state(self, max_batch_size: int, max_num_blocks: int) -> None:
        """Allocates the static buffers for decode batches of up to max_batch_size requests
        with up to max_num_blocks blocks each."""
        ...

    def metadata_for_capture(self, batch_size: int) -> AttnMetadata:
        """Decode metadata of batch_size requests over the static buffers, planned for any
        context length (a graph serves every length)."""
        ...

    def prepare_replay(self, batch_size: int, meta: AttnMetadata) -> None:
        """Copies a live decode batch's metadata (meta.num_seqs <= batch_size requests) into
        the static buffers; the padding rows up to batch_size write no KV."""
        ...
