"""Input checks shared by the kernel launchers: clear ValueErrors instead of silent garbage."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_tensor(
    name: str,
    t: torch.Tensor,
    ndim: int,
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES,
    inner_contiguous: bool = True,
) -> None:
    """Checks rank, dtype and that the last dim is unit-stride (rows may be strided)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} has dtype {t.dtype}; supported: {[str(d) for d in dtypes]}")
    if inner_contiguous and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}")


def check_same(name_a: str, a: object, name_b: str, b: object) -> None:
    if a != b:
        raise ValueError(f"{name_a} ({a}) must equal {name_b} ({b})")


def check_kv_cache(kv_cache: torch.Tensor) -> None:
    """kv_cache: [2, num_blocks, block_size, num_kv_heads, head_dim], fully contiguous."""
    check_tensor("kv_cache", kv_cache, 5)
    if kv_cache.shape[0] != 2:
        raise ValueError(f"kv_cache dim 0 must be 2 (K, V), got shape {tuple(kv_cache.shape)}")
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache must be contiguous: [2, num_blocks, block_size, heads, dim]")
    block_size = kv_cache.shape[2]
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 1, got {block_size}")


def check_head_dim(head_dim: int) -> None:
    if head_dim < 16 or head_dim > 256:
        raise ValueError(f"head_dim must be in [16, 256] for tl.dot, got {head_dim}")
