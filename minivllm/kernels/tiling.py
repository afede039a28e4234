"""Attention tile sizes that fit in shared memory for any element size (fp32 needs twice fp16's).

The launchers' tables are tuned for 2-byte dtypes; fit_attention_tiles shrinks a config
until its shared-memory estimate fits, so float32 runs with the same tables.
"""

from __future__ import annotations

# Per-program shared memory we plan for: under A100's 164 KB opt-in limit (H100/H200: 227 KB),
# so that one table serves every GPU we run on. The 2-byte tables fit it unchanged.
SHARED_MEMORY_BUDGET = 160 * 1024
_MIN_BLOCK = 16  # tl.dot needs tiles of at least 16


def attention_smem_bytes(
    elem_size: int, block_d: int, block_m: int, block_n: int, num_stages: int
) -> int:
    """Shared memory of an attention tile loop: the [block_m, block_d] Q tile plus num_stages
    buffers of the [block_n, block_d] K and V tiles. Triton's own count for float32,
    head_dim 128, (128, 64, stages 3) was 262,400 B: this gives 262,144."""
    return elem_size * block_d * (block_m + 2 * num_stages * block_n)


def fit_attention_tiles(
    elem_size: int, block_d: int, block_m: int, block_n: int, num_stages: int
) -> tuple[int, int, int]:
    """(block_m, block_n, num_stages) shrunk until they fit SHARED_MEMORY_BUDGET: fewer stages
    first (down to 2, which still overlaps loads), then narrower K/V tiles, then fewer rows."""
    while attention_smem_bytes(elem_size, block_d, block_m, block_n, num_stages) > (
        SHARED_MEMORY_BUDGET
    ):
        if num_stages > 2:
            num_stages -= 1
        elif block_n > _MIN_BLOCK:
            block_n //= 2
        elif block_m > _MIN_BLOCK:
            block_m //= 2
        else:
            break  # head_dim > 256 is refused by the launchers before this matters
    return block_m, block_n, num_stages
