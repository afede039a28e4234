"""Tile configs of the block-scaled FP8 GEMM (kernels/fp8_gemm.py): per weight shape (N, K), one
config per bucket of M where `TABLE` has the shape (from
`python -m benchmarks.kernels.bench_fp8_gemm --tune`), a rule by M otherwise. BLOCK_K is
always 128: one activation group and one weight block a step.

Deterministic mode takes one config per shape whatever M is (the rule's prefill config): a
different BLOCK_M may pick a different MMA instruction, and with it other bits in a row.
"""

from __future__ import annotations

from minivllm.kernels.matmul_configs import bucket_config

Fp8Config = tuple[int, int, int, int]  # (block_m, block_n, num_warps, num_stages)
Fp8Buckets = tuple[tuple[int, Fp8Config], ...]  # ((max_m, config), ...), max_m ascending
BLOCK_K = 128
# The number format, shared with the torch reference (layers/quantization/fp8_math.py).
FP8_MAX = 448.0  # e4m3's largest finite value
GROUP_SIZE = BLOCK_K  # activation group = weight block along K = one K step of the GEMM
SCALE_EPS = 1e-10  # smallest amax of a group or block: all-zero ones get a finite scale

# (N, K) -> buckets; the last bucket also covers every larger M. Paste the "table" of
# `python -m benchmarks.kernels.bench_fp8_gemm --tune`'s JSON line here.
TABLE: dict[tuple[int, int], Fp8Buckets] = {}

NARROW_N = 2048  # up to this many outputs: half-width tiles at decode sizes, 2x programs


def rule_buckets(n: int) -> Fp8Buckets:
    """Decode (1-16 rows): 16-row tiles, narrow columns, many programs to read the weight at
    full bandwidth; prefill: 128 x 128 tiles on 8 warps."""
    decode_n = 32 if n <= NARROW_N else 64
    return (
        (16, (16, decode_n, 4, 5)),
        (64, (32, 64, 4, 4)),
        (256, (64, 128, 4, 3)),
        (1 << 62, (128, 128, 8, 3)),
    )


def fp8_gemm_config(n: int, k: int, m: int, deterministic: bool = False) -> Fp8Config:
    """The config for x [m, k] @ w[n, k].T: the shape's bucket of m in TABLE, else the rule's;
    deterministic: the last (prefill) bucket's for every m."""
    buckets = TABLE.get((n, k)) or rule_buckets(n)
    if deterministic:
        return buckets[-1][1]
    return bucket_config(buckets, m)
