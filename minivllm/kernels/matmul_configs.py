"""Tile configs of the batch-invariant GEMM (kernels/matmul.py): per weight shape (N, K), one
config per bucket of M, from `benchmarks/kernels/tune_deterministic.py` on an H200; a rule
otherwise.

A config may change with M only because a non-split-K GEMM reduces each output element over K
in BLOCK_K steps in order, whatever the M and N tiles: every config of one shape has the same
BLOCK_K, and the tuning script admits a config only where the GPU gave a row the same bits
as the reference config at M = 1, 7, 64, 256 and 2048.
"""

from __future__ import annotations

import torch

Config = tuple[int, int, int, int, int]  # (block_m, block_n, block_k, num_warps, num_stages)
Buckets = tuple[tuple[int, Config], ...]  # ((max_m, config), ...), max_m ascending

# (N, K) -> buckets for 2-byte dtypes; the last bucket also covers every larger M. Paste the
# "table" of benchmarks/kernels/tune_deterministic.py's final JSON line here.
# Measured by tune_deterministic.py on one H200 (triton 3.6).
TABLE: dict[tuple[int, int], Buckets] = {
    (4096, 1024): (
        (1, (64, 128, 64, 4, 4)),
        (16, (16, 32, 64, 4, 5)),
        (64, (16, 64, 64, 4, 5)),
        (128, (64, 64, 64, 4, 4)),
        (256, (64, 128, 64, 8, 5)),
        (512, (64, 128, 64, 8, 3)),
        (8192, (128, 128, 64, 8, 3)),
    ),
    (1024, 2048): (
        (64, (16, 32, 128, 4, 5)),
        (256, (64, 32, 128, 4, 4)),
        (512, (64, 64, 128, 8, 4)),
        (8192, (128, 128, 128, 8, 3)),
    ),
    (6144, 1024): (
        (16, (16, 64, 64, 4, 5)),
        (64, (64, 64, 64, 4, 5)),
        (128, (128, 64, 64, 8, 5)),
        (256, (64, 64, 64, 4, 4)),
        (512, (64, 128, 64, 4, 3)),
        (8192, (128, 128, 64, 8, 3)),
    ),
    (1024, 3072): (
        (64, (16, 32, 128, 4, 5)),
        (256, (64, 32, 128, 4, 4)),
        (512, (64, 64, 128, 8, 4)),
        (8192, (128, 128, 128, 8, 3)),
    ),
    (151936, 1024): (
        (1, (16, 64, 64, 4, 5)),
        (16, (16, 64, 64, 4, 3)),
        (64, (64, 128, 64, 8, 3)),
        (512, (128, 128, 64, 8, 3)),
    ),
    (6144, 4096): (
        (16, (16, 64, 128, 4, 5)),
        (64, (64, 64, 128, 8, 5)),
        (128, (64, 128, 128, 8, 4)),
        (256, (128, 128, 128, 8, 3)),
        (512, (64, 128, 128, 8, 4)),
        (8192, (128, 128, 128, 8, 3)),
    ),
    (4096, 4096): (
        (16, (16, 32, 128, 4, 5)),
        (64, (64, 64, 128, 8, 5)),
        (128, (64, 128, 128, 8, 3)),
        (256, (128, 64, 128, 8, 4)),
        (8192, (128, 128, 128, 8, 3)),
    ),
    (24576, 4096): (
        (16, (16, 64, 64, 4, 5)),
        (64, (64, 64, 64, 4, 4)),
        (128, (64, 128, 64, 8, 3)),
        (2048, (128, 128, 64, 8, 3)),
        (8192, (128, 128, 64, 4, 3)),
    ),
    (4096, 12288): (
        (16, (16, 32, 128, 4, 5)),
        (64, (64, 32, 128, 4, 5)),
        (128, (64, 64, 128, 8, 5)),
        (256, (64, 128, 128, 8, 4)),
        (8192, (128, 128, 128, 8, 3)),
    ),
    (151936, 4096): (
        (1, (16, 64, 64, 4, 3)),
        (16, (64, 128, 64, 4, 4)),
        (64, (64, 64, 64, 4, 4)),
        (512, (128, 128, 64, 8, 3)),
    ),
    (2048, 1024): (
        (1, (16, 32, 64, 8, 5)),
        (16, (16, 32, 64, 4, 5)),
        (128, (64, 32, 64, 8, 5)),
        (256, (64, 64, 64, 4, 5)),
        (512, (128, 64, 64, 8, 5)),
        (8192, (128, 128, 64, 8, 3)),
    ),
    (1024, 1024): (
        (1, (16, 32, 64, 4, 4)),
        (16, (16, 32, 64, 4, 5)),
        (64, (64, 32, 64, 8, 5)),
        (128, (64, 32, 64, 8, 4)),
        (256, (64, 32, 64, 8, 5)),
        (512, (64, 64, 64, 4, 5)),
        (2048, (128, 128, 64, 8, 4)),
        (8192, (128, 128, 64, 8, 3)),
    ),
    (3072, 1024): (
        (1, (16, 32, 64, 4, 5)),
        (16, (16, 64, 64, 4, 5)),
        (64, (64, 32, 64, 8, 5)),
        (128, (64, 64, 64, 4, 5)),
        (256, (128, 64, 64, 8, 5)),
        (512, (64, 64, 64, 4, 4)),
        (8192, (128, 128, 64, 8, 3)),
    ),
    (1024, 1536): (
        (1, (16, 32, 128, 4, 5)),
        (16, (16, 32, 128, 4, 4)),
        (64, (16, 32, 128, 4, 5)),
        (256, (64, 32, 128, 4, 4)),
        (512, (64, 64, 128, 8, 4)),
        (8192, (128, 128, 128, 8, 3)),
    ),
    (75968, 1024): (
        (16, (16, 64, 64, 4, 3)),
        (64, (64, 64, 64, 4, 4)),
        (128, (128, 64, 64, 8, 3)),
        (512, (128, 128, 64, 8, 3)),
    ),
    (3072, 4096): (
        (16, (16, 32, 128, 4, 5)),
        (64, (64, 32, 128, 8, 5)),
        (128, (64, 64, 128, 8, 4)),
        (256, (64, 128, 128, 8, 4)),
        (8192, (128, 128, 128, 8, 3)),
    ),
    (4096, 2048): (
        (1, (16, 32, 128, 4, 5)),
        (16, (16, 32, 128, 8, 5)),
        (64, (64, 32, 128, 8, 5)),
        (128, (64, 64, 128, 8, 5)),
        (256, (64, 64, 128, 4, 3)),
        (8192, (128, 128, 128, 8, 3)),
    ),
    (12288, 4096): (
        (16, (16, 64, 64, 4, 5)),
        (64, (64, 64, 64, 4, 5)),
        (128, (64, 64, 64, 4, 4)),
        (256, (64, 128, 64, 4, 3)),
        (8192, (128, 128, 64, 8, 3)),
    ),
    (4096, 6144): (
        (16, (16, 32, 128, 4, 5)),
        (64, (64, 64, 128, 8, 4)),
        (128, (64, 64, 128, 4, 5)),
        (256, (64, 128, 128, 8, 4)),
        (8192, (128, 128, 128, 8, 3)),
    ),
    (75968, 4096): (
        (1, (16, 64, 64, 4, 5)),
        (16, (16, 64, 64, 4, 3)),
        (64, (64, 64, 64, 4, 4)),
        (128, (128, 128, 64, 8, 5)),
        (512, (128, 128, 64, 8, 3)),
    ),
}

# The rule for shapes the table lacks (and float32): one config per dtype whatever M is.
# BLOCK_M 64 on 4 warps is one Hopper warpgroup MMA, so small decode batches still give many
# programs.
_DEFAULTS: dict[torch.dtype, Config] = {
    torch.bfloat16: (64, 128, 64, 4, 4),
    torch.float16: (64, 128, 64, 4, 4),
    torch.float32: (64, 64, 32, 4, 3),
}
NARROW_N = 2048  # up to this many outputs (o_proj, down_proj): half-width tiles, 2x programs


def default_config(dtype: torch.dtype, n: int) -> Config:
    """The rule's config for a weight of n output features; independent of M."""
    if dtype not in _DEFAULTS:
        raise ValueError(f"matmul supports {list(_DEFAULTS)}, got {dtype}")
    block_m, block_n, block_k, num_warps, num_stages = _DEFAULTS[dtype]
    if n <= NARROW_N:
        block_n = min(block_n, 64)
    return block_m, block_n, block_k, num_warps, num_stages


def check_buckets(buckets: Buckets) -> None:
    """Buckets must be non-empty, ascending in max_m, and share one BLOCK_K (a row's K order)."""
    if not buckets:
        raise ValueError("a shape needs at least one bucket")
    bounds = [max_m for max_m, _ in buckets]
    if bounds != sorted(set(bounds)) or bounds[0] < 1:
        raise ValueError(f"bucket bounds must be ascending and >= 1, got {bounds}")
    block_ks = {config[2] for _, config in buckets}
    if len(block_ks) != 1:
        raise ValueError(f"every bucket of a shape needs the same block_k, got {block_ks}")


def bucket_config(buckets: Buckets, m: int) -> Config:
    """The config of the first bucket with max_m >= m (the last one past them all)."""
    for max_m, config in buckets:
        if m <= max_m:
            return config
    return buckets[-1][1]


def matmul_config(dtype: torch.dtype, n: int, k: int, m: int) -> Config:
    """The config for x [m, k] @ w[n, k].T: the shape's bucket in TABLE (2-byte dtypes), else
    the rule. Within a shape only BLOCK_M, BLOCK_N, warps and stages change with m, never
    BLOCK_K (see the module docstring)."""
    buckets = TABLE.get((n, k))
    if buckets is None or dtype not in (torch.bfloat16, torch.float16):
        return default_config(dtype, n)
    return bucket_config(buckets, m)
