"""Tile configs of the fused-MoE GEMMs, in one place: per model shape (experts, hidden,
intermediate, top_k), one config per bucket of step tokens, where measured; a rule otherwise.
`step_config` is the one rule for a step's path: the GEMVs of `gemv.py` for a few pairs, the
aligned grouped GEMMs otherwise and always in deterministic mode.

BLOCK_M (the row block an expert's pairs are padded to) is shared by both GEMMs, since the
pairs are aligned once. BLOCK_K depends on the dtype only, never on the tokens: each output
element is then summed over K in the same order whatever the batch (docs/determinism.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minivllm.kernels.fp8_gemm_configs import BLOCK_K as FP8_BLOCK_K


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


@dataclass(frozen=True)
class GemvTile:
    block_n: int  # output rows of a program
    block_k: int  # the K chunk of a step
    num_warps: int
    num_stages: int  # K chunks in flight (a GEMV's loads are its whole cost)


@dataclass(frozen=True)
class MoeGemvConfig:
    """The small-step path (gemv.py): one program per (pair, N tile), no alignment."""

    gate_up: GemvTile
    down: GemvTile


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


# A step of at most gemv_max_pairs (token, expert) pairs takes the GEMV path, where the grouped
# path pads each expert's run to 16 rows and takes four launches. Measured on one H100
# (benchmarks/kernels/bench_moe_decode.py, Qwen3-30B-A3B's experts, top-8 of 128, bf16, CUDA
# graphs): the GEMVs take 0.78x of the grouped path's time at one token, 0.95x at two, 1.01x at
# four and 1.19x at sixteen, so the GEMVs stop at two tokens of top-8. Block FP8 stays grouped:
# its GEMVs took 1.7-2.6x the grouped FP8 time at 1-16 tokens (the bench times both).
GEMV_MAX_PAIRS = 16


def gemv_max_pairs(num_experts: int) -> int:
    return min(GEMV_MAX_PAIRS, num_experts // 2)


def gemv_config(dtype: torch.dtype, fp8: bool) -> MoeGemvConfig:
    """Small row tiles, so that a batch-1 decode at Qwen3-30B-A3B's shape runs several
    programs an SM (768 gate/up programs of 8 rows of I, 512 down programs of 4 rows of H),
    each thread's loads 16 bytes wide. FP8 steps are one quantization group (128) wide."""
    if fp8:
        return MoeGemvConfig(GemvTile(16, FP8_BLOCK_K, 4, 3), GemvTile(8, FP8_BLOCK_K, 2, 3))
    block_k = 128 if dtype == torch.float32 else 256
    return MoeGemvConfig(GemvTile(8, block_k, 4, 3), GemvTile(4, block_k, 4, 3))


def step_config(
    dtype: torch.dtype,
    shape: MoeShape,
    num_tokens: int,
    fp8: bool = False,
    batch_invariant: bool = False,
) -> MoeTileConfig | MoeGemvConfig:
    """The path and tiles of a step. batch_invariant (deterministic mode): always the grouped
    GEMMs, whose per-element sums do not depend on the step (a GEMV's tl.sum adds in another
    order: a token decoded alone would differ from the same token in a prefill step). Block
    FP8 always takes the grouped GEMMs (faster at every size measured: see GEMV_MAX_PAIRS)."""
    num_experts, _, _, top_k = shape
    small = num_tokens * top_k <= gemv_max_pairs(num_experts)
    if small and not batch_invariant and not fp8:
        return gemv_config(dtype, fp8=False)
    return moe_config(dtype, shape, num_tokens)
