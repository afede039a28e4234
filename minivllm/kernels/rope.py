"""Neox-style rotary embedding on q and k in place, optionally after per-head RMSNorm (Qwen3)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_same, check_tensor


@triton.jit
def _rope_heads(
    ptr, stride_h, cos, sin, w_ptr, eps, offs_r,
    NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, HAS_NORM: tl.constexpr,
):  # fmt: skip
    """Rotates the [NUM_HEADS, 2 * HALF] row block at ptr in place."""
    offs_h = tl.arange(0, BLOCK_H)
    r_mask = offs_r < HALF
    mask = (offs_h[:, None] < NUM_HEADS) & r_mask[None, :]
    p1 = ptr + offs_h[:, None] * stride_h + offs_r[None, :]
    x1 = tl.load(p1, mask=mask, other=0.0)
    x2 = tl.load(p1 + HALF, mask=mask, other=0.0)
    dtype = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    if HAS_NORM:
        rstd = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)
        w1 = tl.load(w_ptr + offs_r, mask=r_mask, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + offs_r, mask=r_mask, other=0.0).to(tl.float32)
        # Same roundings as the unfused model: normed -> dtype, * weight -> dtype.
        x1 = ((x1 * rstd[:, None]).to(dtype).to(tl.float32) * w1[None, :]).to(dtype).to(tl.float32)
        x2 = ((x2 * rstd[:, None]).to(dtype).to(tl.float32) * w2[None, :]).to(dtype).to(tl.float32)
    o1 = x1 * cos[None, :] - x2 * sin[None, :]
    o2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(p1, o1.to(dtype), mask=mask)
    tl.store(p1 + HALF, o2.to(dtype), mask=mask)


# positions may be a slice of a persistent buffer: no alignment specialization (no recompiles).
@triton.jit(do_not_specialize_on_alignment=["positions_ptr"])
def _rope_kernel(
    q_ptr, k_ptr, positions_ptr, cos_sin_ptr, q_w_ptr, k_w_ptr, eps,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
    NUM_Q_HEADS: tl.constexpr, NUM_K_HEADS: tl.constexpr, HALF: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, HAS_NORM: tl.constexpr,
):  # fmt: skip
    """Grid (num_tokens,): one program rotates every q and k head of one token."""
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_R)
    r_mask = offs_r < HALF
    cos = tl.load(cos_sin_ptr + pos * stride_cs + offs_r, mask=r_mask, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + offs_r, mask=r_mask, other=0.0)
    sin = sin.to(tl.float32)
    _rope_heads(
        q_ptr + token * stride_qt, stride_qh, cos, sin, q_w_ptr, eps, offs_r,
        NUM_Q_HEADS, HALF, BLOCK_QH, HAS_NORM,
    )  # fmt: skip
    _rope_heads(
        k_ptr + token * stride_kt, stride_kh, cos, sin, k_w_ptr, eps, offs_r,
        NUM_K_HEADS, HALF, BLOCK_KH, HAS_NORM,
    )  # fmt: skip


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> None:
    """Applies neox RoPE to q and k in place: x1, x2 = halves; (x1*cos - x2*sin, x2*cos + x1*sin).

    positions: [num_tokens] int64/int32. q: [num_tokens, num_q_heads, head_dim], k:
    [num_tokens, num_kv_heads, head_dim] (last dim contiguous; views of a qkv buffer are fine).
    cos_sin_cache: [max_position, head_dim] = cat(cos, sin) over head_dim // 2 frequencies.
    With q_norm_weight/k_norm_weight [head_dim] each head is RMS-normalized first (Qwen3).
    """
    check_tensor("positions", positions, 1, (torch.int64, torch.int32), False)
    check_tensor("q", q, 3)
    check_tensor("k", k, 3)
    check_tensor("cos_sin_cache", cos_sin_cache, 2)
    head_dim = q.shape[2]
    check_same("k head_dim", k.shape[2], "q head_dim", head_dim)
    check_same("cos_sin_cache.shape[1]", cos_sin_cache.shape[1], "head_dim", head_dim)
    check_same("positions length", positions.shape[0], "q tokens", q.shape[0])
    check_same("k tokens", k.shape[0], "q tokens", q.shape[0])
    check_same("k.dtype", k.dtype, "q.dtype", q.dtype)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for RoPE, got {head_dim}")
    has_norm = q_norm_weight is not None
    if has_norm != (k_norm_weight is not None):
        raise ValueError("pass both q_norm_weight and k_norm_weight, or neither")
    if has_norm:
        for name, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
            check_tensor(name, w, 1)
            check_same(f"{name}.shape[0]", w.shape[0], "head_dim", head_dim)
    num_tokens = q.shape[0]
    if num_tokens == 0:
        return
    half = head_dim // 2
    _rope_kernel[(num_tokens,)](
        q, k, positions, cos_sin_cache,
        q_norm_weight if has_norm else q, k_norm_weight if has_norm else k, eps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
        NUM_Q_HEADS=q.shape[1], NUM_K_HEADS=k.shape[1], HALF=half,
        BLOCK_R=triton.next_power_of_2(half), BLOCK_QH=triton.next_power_of_2(q.shape[1]),
        BLOCK_KH=triton.next_power_of_2(k.shape[1]), HAS_NORM=has_norm, num_warps=4,
    )  # fmt: skip
