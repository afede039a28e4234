"""Tile configs of the fused-MoE GEMMs, in one place: per model shape (experts, hidden,
intermediate, top_k), one config per bucket of step tokens, where measured; a rule otherwise.

BLOCK_M (the row block an expert's pairs are padded to) is shared by both GEMMs, since the
pairs are aligned once. BLOCK_K depends on the dtype only, never on the tokens: each output
element is then summed over K in the same order whatever the batch (docs/determinism.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GemmTile:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class MoeTileConfig:
    block_m: int
    gate_up: GemmTile  # x @ w13[e].T with SiLU-and-mul: N = intermediate, K = hidden
    down: GemmTile  # act @ w2[e].T, weighted: N = hidden, K = intermediate


MoeShape = tuple[int, int, int, int]  # (num_experts, hidden, intermediate per rank, top_k)

# MoeShape -> ((max_tokens, config), ...), max_tokens ascending, the last also covering every
# larger step; 2-byte dtypes only; every config keeps _BLOCK_K's block_k in both GEMMs (batch
# invariance). Empty until measured on a GPU (benchmarks/kernels/bench_moe.py --tune).
TABLE: dict[MoeShape, tuple[tuple[int, MoeTileConfig], ...]] = {}

# BLOCK_K per dtype: float32 tiles hold twice the bytes.
_BLOCK_K = {torch.bfloat16: 64, torch.float16: 64, torch.float32: 32}


def block_m_rule(num_tokens: int, top_k: int, num_experts: int) -> int:
    """The smallest power of two from 16 (tl.dot's minimum) to 64 that holds an expert's
    average share of the step's pairs: decode steps pad little, prefill fills the tensor cores."""
    per_expert = num_tokens * top_k / num_experts
    block_m = 16
    while block_m < 64 and block_m < per_expert:
        block_m *= 2
    return block_m


def rule_config(dtype: torch.dtype, num_tokens: int, top_k: int, num_experts: int) -> MoeTileConfig:
    if dtype not in _BLOCK_K:
        raise ValueError(f"fused MoE supports {list(_BLOCK_K)}, got {dtype}")
    block_m = block_m_rule(num_tokens, top_k, num_experts)
    block_k = _BLOCK_K[dtype]
    stages = 2 if dtype == torch.float32 else 3
    # The gated GEMM holds two accumulators (gate and up): its column tile stays at 64.
    gate_up = GemmTile(64, block_k, 4, stages)
    down = GemmTile(64 if block_m < 64 else 128, block_k, 4, stages)
    return MoeTileConfig(block_m, gate_up, down)


def moe_config(dtype: torch.dtype, shape: MoeShape, num_tokens: int) -> MoeTileConfig:
    """The tiles for a step of num_tokens tokens: the shape's bucket in TABLE (2-byte dtypes),
    else the rule."""
    num_experts, _, _, top_k = shape
    buckets = TABLE.get(shape)
    if buckets is None or dtype not in (torch.bfloat16, torch.float16):
        return rule_config(dtype, num_tokens, top_k, num_experts)
    for max_tokens, config in buckets:
        if num_tokens <= max_tokens:
            return config
    return buckets[-1][1]
