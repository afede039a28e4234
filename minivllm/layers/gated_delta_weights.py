"""Qwen3-Next's Gated DeltaNet in-projections as its checkpoints store them, fused and grouped
by key head, split into GatedDeltaNet's four (Qwen3.5's layout) at load.

`in_proj_qkvz` [H_k * (2 d_k + 2 r d_v), hidden], r = H_v / H_k: for each key head g in turn,
its query rows, its key rows, then the value rows and the z rows of its r value heads
(g r .. g r + r - 1). `in_proj_ba` [H_k * 2 r, hidden]: for each key head, its value heads' b
rows, then their a rows. Transformers' Qwen3NextGatedDeltaNet reorders the projections' outputs
so; reordering the rows once gives the same q, k, v, z, b, a.

A block-FP8 checkpoint's scales (`weight_scale_inv`, compressed-tensors' `weight_scale`: one
row per 128 weight rows) are split with the rows they scale: each 128-row block of a split
projection must come from one block of the fused one, else a ValueError names the tensor."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial

import torch

from minivllm.layers.quantization.config import BLOCK

_FUSED_IN_PROJ = re.compile(
    r"(?P<prefix>.+\.linear_attn\.)in_proj_(?P<fused>qkvz|ba)\."
    r"(?P<leaf>weight|weight_scale_inv|weight_scale)"
)


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


def split_in_proj(
    name: str,
    tensor: torch.Tensor,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
) -> list[tuple[str, torch.Tensor]] | None:
    """A fused in-projection's checkpoint tensor (`<prefix>.linear_attn.in_proj_qkvz.weight`,
    `in_proj_ba`, or their block scales) -> (name, tensor) of Qwen3.5's projections
    (`in_proj_qkv`, `in_proj_z`; `in_proj_b`, `in_proj_a`); None for any other tensor."""
    match = _FUSED_IN_PROJ.fullmatch(name)
    if match is None:
        return None
    heads = {"num_k_heads": num_k_heads, "num_v_heads": num_v_heads}
    if match["fused"] == "qkvz":
        parts = ("qkv", "z")
        rows = num_k_heads * (2 * head_k_dim + 2 * (num_v_heads // num_k_heads) * head_v_dim)
        split = partial(split_qkvz, **heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim)
    else:
        parts, rows = ("b", "a"), 2 * num_v_heads
        split = partial(split_ba, **heads)
    leaf = match["leaf"]
    pieces = split(tensor) if leaf == "weight" else split_block_scales(name, tensor, split, rows)
    return [(f"{match['prefix']}in_proj_{p}.{leaf}", t) for p, t in zip(parts, pieces, strict=True)]


def split_block_scales(
    name: str,
    scale: torch.Tensor,
    split: Callable[[torch.Tensor], tuple[torch.Tensor, ...]],
    rows: int,
    block: int = BLOCK[0],
) -> tuple[torch.Tensor, ...]:
    """scale [cdiv(rows, block), column blocks] of a weight of `rows` rows -> each part's
    scale, for the parts `split` makes of the weight's rows: the block each part's rows came
    from, one per `block` of them. A part's block whose rows came from two blocks of the
    weight is a ValueError naming the tensor (one scale row cannot serve it)."""
    num_blocks = -(-rows // block)
    if scale.dim() != 2 or scale.shape[0] != num_blocks:
        raise ValueError(
            f"{name} has shape {tuple(scale.shape)}; a {rows}-row weight in {block}-row FP8 "
            f"blocks needs {num_blocks} scale rows"
        )
    # Each weight row's block, as a one-column weight: split the same way as the rows.
    row_blocks = torch.arange(rows).div(block, rounding_mode="floor")[:, None]
    pieces = []
    for part in split(row_blocks):
        sources = part[:, 0].split(block)  # the blocks the part's own blocks' rows came from
        if any(bool((s != s[0]).any()) for s in sources):
            raise ValueError(
                f"{name}: splitting it falls inside a {block}-row FP8 block (a split "
                f"projection's block would need two scales); its head sizes must keep each "
                f"projection's rows in whole blocks"
            )
        pieces.append(scale[torch.stack([s[0] for s in sources])])
    return tuple(pieces)
