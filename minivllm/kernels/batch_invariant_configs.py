"""Tile configs of the batch-invariant attention kernel (kernels/batch_invariant_attention.py):
per head_dim, one BLOCK_N (a row's tile boundaries, so its arithmetic) for every launch; the
rest (rows, warps, stages) only lays out registers. Tuned values come from
`benchmarks/kernels/tune_deterministic.py` on an H200, where the GPU put them in one bit class."""

from __future__ import annotations

# head_dim bound -> (2-byte, 4-byte dtype) configs, each (BLOCK_M rows = query tokens * group,
# BLOCK_N, num_warps, num_stages): the prefill kernel's small configs (float32: tiles that fit
# in shared memory), for every batch shape. BLOCK_N sets a row's tile boundaries, so it is one
# per head_dim; BLOCK_M, warps and stages change only the register layout, which no longer
# touches a row's arithmetic (row sums by MMA), and may differ for decode-only launches.
_CONFIGS = (
    (64, ((64, 64, 4, 3), (64, 64, 4, 2))),
    (128, ((128, 128, 8, 3), (64, 32, 4, 2))),  # 2-byte: tune_deterministic.py, H200
    (256, ((64, 32, 8, 2), (32, 16, 4, 2))),
)
# Decode-only launches (one query row per request): (BLOCK_M, num_warps, num_stages) per
# (head_dim bound, elem_size 2 or 4); the varlen config where absent. BLOCK_M 16 pads a GQA
# group as the default decode kernel does instead of 64 rows. Set from
# benchmarks/kernels/tune_deterministic.py, only where the GPU gave decode and prefill tiles
# the same bits (an MMA of 16 rows and a 64-row warpgroup MMA must round alike).
_DECODE_CONFIGS: dict[tuple[int, int], tuple[int, int, int]] = {(128, 2): (16, 4, 4)}


def batch_invariant_config(
    head_dim: int, elem_size: int = 2, decode: bool = False
) -> tuple[int, int, int, int]:
    """(block_m, block_n, num_warps, num_stages) for q/KV elements of elem_size bytes; decode:
    the config of a launch whose rows are all decodes (same block_n)."""
    for bound, (half, full) in _CONFIGS:
        if head_dim <= bound:
            block_m, block_n, num_warps, num_stages = half if elem_size <= 2 else full
            key = (bound, 2 if elem_size <= 2 else 4)
            if decode and key in _DECODE_CONFIGS:
                block_m, num_warps, num_stages = _DECODE_CONFIGS[key]
            return block_m, block_n, num_warps, num_stages
    raise ValueError(f"head_dim {head_dim} > 256 is not supported")
