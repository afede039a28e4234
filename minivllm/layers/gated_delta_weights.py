"""Qwen3-Next's Gated DeltaNet in-projections as its checkpoints store them, fused and grouped
by key head, split into GatedDeltaNet's four (Qwen3.5's layout) at load.

`in_proj_qkvz` [H_k * (2 d_k + 2 r d_v), hidden], r = H_v / H_k: for each key head g in turn,
its query rows, its key rows, then the value rows and the z rows of its r value heads
(g r .. g r + r - 1). `in_proj_ba` [H_k * 2 r, hidden]: for each key head, its value heads' b
rows, then their a rows. Transformers' Qwen3NextGatedDeltaNet reorders the projections' outputs
so; reordering the rows once gives the same q, k, v, z, b, a."""

from __future__ import annotations

import torch


def split_qkvz(
    weight: torch.Tensor, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """in_proj_qkvz's weight -> (in_proj_qkv's: every q row, every k row, every v row;
    in_proj_z's), a ValueError if its shape is not the config's."""
    r = num_v_heads // num_k_heads
    group = 2 * head_k_dim + 2 * r * head_v_dim
    _check_rows(weight, "in_proj_qkvz", num_k_heads * group)
    q, k, v, z = weight.view(num_k_heads, group, -1).split(
        [head_k_dim, head_k_dim, r * head_v_dim, r * head_v_dim], dim=1
    )
    hidden = weight.shape[-1]
    qkv = torch.cat([part.reshape(-1, hidden) for part in (q, k, v)])
    return qkv, z.reshape(-1, hidden)


def split_ba(
    weight: torch.Tensor, num_k_heads: int, num_v_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """in_proj_ba's weight -> (in_proj_b's, in_proj_a's), rows by value head."""
    r = num_v_heads // num_k_heads
    _check_rows(weight, "in_proj_ba", 2 * num_v_heads)
    b, a = weight.view(num_k_heads, 2 * r, -1).split([r, r], dim=1)
    hidden = weight.shape[-1]
    return b.reshape(-1, hidden), a.reshape(-1, hidden)


def _check_rows(weight: torch.Tensor, name: str, rows: int) -> None:
    if weight.dim() != 2 or weight.shape[0] != rows:
        raise ValueError(
            f"{name}.weight has shape {tuple(weight.shape)}; the config's linear-attention "
            f"heads need {rows} rows"
        )
