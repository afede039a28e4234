"""The triton backend's deterministic path: every row through the batch-invariant kernels
(docs/determinism.md): decode rows in their own launch (decode tiles; split by segment for
parallelism in small batches), then the prefill rows, through the kernel the backend picks
(the Triton walk, or on Hopper the Gluon kernel of the same bits)."""

from __future__ import annotations

import torch

from minivllm.attention.base import AttnMetadata
from minivllm.kernels.attention_segments import SEGMENTS
from minivllm.kernels.batch_invariant_attention import batch_invariant_attention

# Decode rows are split by segment while they give fewer (request, kv head) programs than this
# many SMs' worth: more, shorter programs (and a fold kernel) instead of one walk per row.
# A speed choice only (both launches give the same bits); benchmarks/kernels/tune_deterministic.py
# times both at batch 256.
SPLIT_DECODE_WAVES = 1.0


class BatchInvariantAttention:
    """Owns the split launch's scratch: per-segment states of up to `max_split_rows` decode
    rows (a batch is split only when it has fewer programs than SPLIT_DECODE_WAVES * SMs)
    and the most segments a row of max_model_len keys has, allocated once so that the decode
    path is graph-capturable."""

    def __init__(
        self,
        max_num_seqs: int,
        max_model_len: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        num_sms: int,
        device: torch.device,
    ) -> None:
        self.split_programs = int(SPLIT_DECODE_WAVES * num_sms)
        self.max_split_rows = min(max_num_seqs, -(-self.split_programs // num_kv_heads))
        self.max_segments = SEGMENTS.max_count(max_model_len)
        shape = (self.max_split_rows, num_heads, self.max_segments)
        self.part_acc = torch.empty(*shape, head_dim, dtype=torch.float32, device=device)
        self.part_m = torch.empty(shape, dtype=torch.float32, device=device)
        self.part_l = torch.empty(shape, dtype=torch.float32, device=device)

    def num_segments(self, num_decodes: int, num_kv_heads: int, max_seq_len: int) -> int:
        """Segments of the split launch for these decode rows (a grid axis that fits every row
        of at most max_seq_len <= max_model_len keys; a graph captured at max_model_len fits
        every replay), or 0 for one pass per row. A speed choice only: both launches give the
        same bits."""
        segments = SEGMENTS.max_count(max_seq_len)
        if (
            num_decodes > self.max_split_rows
            or num_decodes * num_kv_heads >= self.split_programs
            or segments < 2
        ):
            return 0
        return segments

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttnMetadata,
        scale: float,
        out: torch.Tensor,  # [num_tokens, num_heads, head_dim], written
        prefill_fn=batch_invariant_attention,  # the prefill rows' kernel (same bits either way)
        k_scale: float = 1.0,  # an fp8 cache's scales
        v_scale: float = 1.0,
    ) -> None:
        num_decodes = meta.num_decode_tokens
        start = 0
        if num_decodes > 0:
            segments = self.num_segments(num_decodes, kv_cache.shape[3], meta.max_seq_len)
            scratch = {"part_acc": self.part_acc, "part_m": self.part_m, "part_l": self.part_l}
            batch_invariant_attention(
                q[:num_decodes],
                kv_cache,
                meta.query_start_loc[: num_decodes + 1],
                meta.seq_lens[:num_decodes],
                meta.block_tables[:num_decodes],
                scale,
                out[:num_decodes],
                num_segments=segments,
                decode_rows=True,
                k_scale=k_scale,
                v_scale=v_scale,
                **(scratch if segments > 0 else {}),
            )
            start = num_decodes
        if meta.num_seqs > start:
            prefill_fn(
                q,
                kv_cache,
                meta.query_start_loc[start:],
                meta.seq_lens[start:],
                meta.block_tables[start:],
                scale,
                out,
                start_row=start,
                k_scale=k_scale,
                v_scale=v_scale,
            )
