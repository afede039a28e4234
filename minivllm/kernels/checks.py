"""What the kernel launchers share: input checks (clear ValueErrors instead of silent
garbage) and the attention kernels' LOG2E."""

from __future__ import annotations

import os

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# An fp8 KV cache (kv_cache_dtype="fp8") holds e4m3 values: K / k_scale and V / v_scale.
FP8_KV_DTYPE = torch.float8_e4m3fn
KV_CACHE_DTYPES = (*FLOAT_DTYPES, FP8_KV_DTYPE)
# The attention kernels exponentiate base 2: scores are scaled by scale * LOG2E.
LOG2E = 1.4426950408889634


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
    check_tensor("kv_cache", kv_cache, 5, KV_CACHE_DTYPES)
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


def check_paged_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """The checks every paged attention launcher makes: q, out [rows, num_heads, head_dim],
    kv_cache, block_tables [num_seqs, max_num_blocks] int32, seq_lens [num_seqs] int32."""
    check_tensor("q", q, 3)
    check_kv_cache(kv_cache)
    check_tensor("block_tables", block_tables, 2, (torch.int32,))
    check_tensor("seq_lens", seq_lens, 1, (torch.int32,))
    check_tensor("out", out, 3)
    check_head_dim(q.shape[2])
    if kv_cache.dtype != FP8_KV_DTYPE:
        check_same("q.dtype", q.dtype, "kv_cache.dtype", kv_cache.dtype)
    check_same("out.shape", tuple(out.shape), "q.shape", tuple(q.shape))
    check_same("q head_dim", q.shape[2], "kv_cache head_dim", kv_cache.shape[4])
    check_same("block_tables rows", block_tables.shape[0], "num_seqs", seq_lens.shape[0])
    if q.shape[1] % kv_cache.shape[3]:
        raise ValueError(f"num_heads {q.shape[1]} must be a multiple of {kv_cache.shape[3]}")


def check_kv_scales(kv_cache: torch.Tensor, k_scale: float, v_scale: float) -> bool:
    """Whether kv_cache is fp8; its dequantization scales must be finite and > 0, and a
    cache in the model's dtype takes no scales (1.0)."""
    is_fp8 = kv_cache.dtype == FP8_KV_DTYPE
    if k_scale == 1.0 and v_scale == 1.0:  # the usual case, checked on every launch
        return is_fp8
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not 0.0 < value < float("inf"):
            raise ValueError(f"{name} must be finite and > 0, got {value}")
        if not is_fp8 and value != 1.0:
            raise ValueError(f"{name}={value}: KV scales apply to an fp8 cache only")
    return is_fp8


def runs_inline_ptx(t: torch.Tensor) -> bool:
    """Whether a kernel launched on t can run inline PTX: CUDA, and not Triton's interpreter
    (TRITON_INTERPRET=1), which cannot."""
    return t.device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"
