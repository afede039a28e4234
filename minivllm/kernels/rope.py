"""Neox-style rotary embedding on q and k in place, optionally after per-head RMSNorm (Qwen3),
and optionally writing the rotated K and V into the paged KV cache in the same kernel (one
launch per layer less than RoPE then `store_kv`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_same, check_tensor
from minivllm.kernels.kv_store import KVWrite, check_store_inputs, store_rows


@triton.jit
def _rope_heads(
    ptr, stride_h, cos, sin, w_ptr, eps, offs_r,
    NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, HAS_NORM: tl.constexpr,
):  # fmt: skip
    """Rotates the [NUM_HEADS, 2 * HALF] row block at ptr in place; returns its two rotated
    halves [BLOCK_H, BLOCK_R] in the block's dtype."""
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
    o1 = (x1 * cos[None, :] - x2 * sin[None, :]).to(dtype)
    o2 = (x2 * cos[None, :] + x1 * sin[None, :]).to(dtype)
    tl.store(p1, o1, mask=mask)
    tl.store(p1 + HALF, o2, mask=mask)
    return o1, o2


@triton.jit
def _store_token_kv(
    cache_ptr, slot, k1, k2, v_ptr, stride_vh, v_cache_offset, k_scale, v_scale, offs_r,
    NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, KV_FP8: tl.constexpr,
):  # fmt: skip
    """Writes one token's rotated K (its halves k1, k2) and its V rows (at v_ptr) into cache
    slot `slot`, as store_kv would."""
    offs_h = tl.arange(0, BLOCK_H)
    mask = (offs_h[:, None] < NUM_HEADS) & (offs_r < HALF)[None, :]
    # A cache slot row is [num_kv_heads, head_dim], contiguous.
    dst = cache_ptr + slot * (NUM_HEADS * 2 * HALF) + offs_h[:, None] * (2 * HALF) + offs_r[None, :]
    store_rows(dst, k1, mask, k_scale, KV_FP8)
    store_rows(dst + HALF, k2, mask, k_scale, KV_FP8)
    src = v_ptr + offs_h[:, None] * stride_vh + offs_r[None, :]
    store_rows(dst + v_cache_offset, tl.load(src, mask=mask), mask, v_scale, KV_FP8)
    store_rows(dst + v_cache_offset + HALF, tl.load(src + HALF, mask=mask), mask, v_scale, KV_FP8)


# positions and slot_mapping may be slices of persistent buffers: no alignment specialization
# (no recompiles).
@triton.jit(do_not_specialize_on_alignment=["positions_ptr", "slot_ptr"])
def _rope_kernel(
    q_ptr, k_ptr, positions_ptr, cos_sin_ptr, q_w_ptr, k_w_ptr, eps,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
    v_ptr, cache_ptr, slot_ptr, stride_vt, stride_vh, v_cache_offset, k_scale, v_scale,
    NUM_Q_HEADS: tl.constexpr, NUM_K_HEADS: tl.constexpr, HALF: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, HAS_NORM: tl.constexpr,
    STORE_KV: tl.constexpr, KV_FP8: tl.constexpr,
):  # fmt: skip
    """Grid (num_tokens,): one program rotates every q and k head of one token. STORE_KV: it
    then writes the token's K and V into its cache slot (none for slot -1, a padded row)."""
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
    k1, k2 = _rope_heads(
        k_ptr + token * stride_kt, stride_kh, cos, sin, k_w_ptr, eps, offs_r,
        NUM_K_HEADS, HALF, BLOCK_KH, HAS_NORM,
    )  # fmt: skip
    if STORE_KV:
        slot = tl.load(slot_ptr + token).to(tl.int64)
        if slot >= 0:
            _store_token_kv(
                cache_ptr, slot, k1, k2, v_ptr + token * stride_vt, stride_vh, v_cache_offset,
                k_scale, v_scale, offs_r, NUM_K_HEADS, HALF, BLOCK_KH, KV_FP8,
            )  # fmt: skip


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    kv_write: KVWrite | None = None,
) -> None:
    """Applies neox RoPE to q and k in place: x1, x2 = halves; (x1*cos - x2*sin, x2*cos + x1*sin).

    positions: [num_tokens] int64/int32. q: [num_tokens, num_q_heads, head_dim], k:
    [num_tokens, num_kv_heads, head_dim] (last dim contiguous; views of a qkv buffer are fine).
    cos_sin_cache: [max_position, head_dim] = cat(cos, sin) over head_dim // 2 frequencies.
    With q_norm_weight/k_norm_weight [head_dim] each head is RMS-normalized first (Qwen3).
    kv_write: also write the rotated k and kv_write.v into the paged cache, with the bytes
    store_kv(k, v, ...) would write after this call.
    """
    _check_rope_inputs(positions, q, k, cos_sin_cache, q_norm_weight, k_norm_weight)
    is_fp8 = False
    if kv_write is not None:
        is_fp8 = check_store_inputs(k, *kv_write)
    num_tokens, head_dim = q.shape[0], q.shape[2]
    if num_tokens == 0:
        return
    has_norm = q_norm_weight is not None
    # Without kv_write the kernel reads none of these (STORE_KV off): any tensors will do.
    v, kv_cache, slots, k_scale, v_scale = kv_write or KVWrite(k, k, positions)
    half = head_dim // 2
    _rope_kernel[(num_tokens,)](
        q, k, positions, cos_sin_cache,
        q_norm_weight if has_norm else q, k_norm_weight if has_norm else k, eps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
        v, kv_cache, slots, v.stride(0), v.stride(1), kv_cache.numel() // 2, k_scale, v_scale,
        NUM_Q_HEADS=q.shape[1], NUM_K_HEADS=k.shape[1], HALF=half,
        BLOCK_R=triton.next_power_of_2(half), BLOCK_QH=triton.next_power_of_2(q.shape[1]),
        BLOCK_KH=triton.next_power_of_2(k.shape[1]), HAS_NORM=has_norm,
        STORE_KV=kv_write is not None, KV_FP8=is_fp8, num_warps=4,
    )  # fmt: skip


def _check_rope_inputs(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
) -> None:
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
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("pass both q_norm_weight and k_norm_weight, or neither")
    for name, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        if w is not None:
            check_tensor(name, w, 1)
            check_same(f"{name}.shape[0]", w.shape[0], "head_dim", head_dim)
