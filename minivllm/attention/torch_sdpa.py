"""The torch_sdpa backend: reference and CPU path.

It writes new K/V into the paged cache, gathers each request's context back out of it and
calls scaled_dot_product_attention. Slow but obviously right; the ground truth in tests.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from minivllm.attention.base import AttnMetadata

FP8_KV_DTYPE = torch.float8_e4m3fn  # kv_cache_dtype="fp8"
FP8_MAX = 448.0


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Writes k/v rows [num_tokens, num_kv_heads, head_dim] at their slots; -1 slots are skipped.
    An fp8 cache gets k / k_scale and v / v_scale, saturated to its +-448 range."""
    num_blocks, block_size = kv_cache.shape[1], kv_cache.shape[2]
    flat = kv_cache.view(2, num_blocks * block_size, *kv_cache.shape[3:])
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    flat[0, slots] = _to_cache(k[valid], kv_cache.dtype, k_scale)
    flat[1, slots] = _to_cache(v[valid], kv_cache.dtype, v_scale)


def _to_cache(x: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    if dtype != FP8_KV_DTYPE:
        return x
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(dtype)


class TorchSDPABackend:
    name = "torch_sdpa"
    # It loops over requests with host-side lengths: not capturable, so it always runs eagerly.
    supports_cuda_graphs = False

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttnMetadata,
        scale: float,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        out: torch.Tensor | None = None,
        write_kv: bool = True,
    ) -> torch.Tensor:
        if write_kv:
            store_kv(k, v, kv_cache, meta.slot_mapping, k_scale, v_scale)
        block_size = kv_cache.shape[2]
        # Host lengths: from the metadata's host copies when it has them, else one sync.
        starts = _host_list(meta.query_start_loc_cpu, meta.query_start_loc)
        seq_lens = _host_list(meta.seq_lens_cpu, meta.seq_lens)
        if out is None:
            out = torch.empty_like(q)
        group = q.shape[1] // kv_cache.shape[3]
        for i, seq_len in enumerate(seq_lens):
            q_start, q_end = starts[i], starts[i + 1]
            num_q = q_end - q_start
            if num_q == 0:
                continue
            num_blocks = (seq_len + block_size - 1) // block_size
            blocks = meta.block_tables[i, :num_blocks].long()
            # ctx_k, ctx_v: [seq_len, num_kv_heads, head_dim]
            ctx_k = kv_cache[0, blocks].flatten(0, 1)[:seq_len]
            ctx_v = kv_cache[1, blocks].flatten(0, 1)[:seq_len]
            # Query j sits at position seq_len - num_q + j and sees keys up to it.
            q_pos = torch.arange(seq_len - num_q, seq_len, device=q.device)
            mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]
            qi = q[q_start:q_end].transpose(0, 1)  # [heads, num_q, head_dim]
            ki = ctx_k.transpose(0, 1).repeat_interleave(group, dim=0)
            vi = ctx_v.transpose(0, 1).repeat_interleave(group, dim=0)
            # An fp8 cache holds K / k_scale and V / v_scale (else both scales are 1).
            o = F.scaled_dot_product_attention(
                qi.float(), ki.float() * k_scale, vi.float() * v_scale, attn_mask=mask, scale=scale
            )
            out[q_start:q_end] = o.transpose(0, 1).to(q.dtype)
        return out


def _host_list(host: np.ndarray | None, device_tensor: torch.Tensor) -> list[int]:
    return (host if host is not None else device_tensor).tolist()
