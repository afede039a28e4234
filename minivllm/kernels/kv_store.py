"""Writes this step's new K/V rows into the paged KV cache at their slots."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_kv_cache, check_same, check_tensor


# slot_mapping may be a slice of a persistent buffer: no alignment specialization (no recompiles).
@triton.jit(do_not_specialize_on_alignment=["slot_ptr"])
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    v_cache_offset,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Grid (num_tokens,): one program copies one token's [num_kv_heads, head_dim] K and V."""
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:  # padded row
        return
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
    tok = token.to(tl.int64)
    k = tl.load(k_ptr + tok * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + tok * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    # A cache slot row is [num_kv_heads, head_dim], contiguous.
    dst = (
        cache_ptr + slot * (NUM_KV_HEADS * HEAD_DIM) + offs_h[:, None] * HEAD_DIM + offs_d[None, :]
    )
    tl.store(dst, k, mask=mask)
    tl.store(dst + v_cache_offset, v, mask=mask)


def store_kv(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Writes k/v rows into kv_cache at slot_mapping; rows whose slot is -1 are skipped.

    k, v: [num_tokens, num_kv_heads, head_dim], last dim contiguous (token/head strides free,
    so views of a fused qkv projection work). kv_cache: [2, num_blocks, block_size,
    num_kv_heads, head_dim], contiguous, same dtype as k. slot_mapping: [num_tokens] int64
    (int32 accepted), slot = block_id * block_size + offset_in_block.
    """
    check_tensor("k", k, 3)
    check_tensor("v", v, 3)
    check_kv_cache(kv_cache)
    check_tensor("slot_mapping", slot_mapping, 1, (torch.int64, torch.int32), False)
    check_same("k.shape", tuple(k.shape), "v.shape", tuple(v.shape))
    check_same("k.shape[1:]", tuple(k.shape[1:]), "kv_cache.shape[3:]", tuple(kv_cache.shape[3:]))
    check_same("k.dtype", k.dtype, "kv_cache.dtype", kv_cache.dtype)
    check_same("v.dtype", v.dtype, "kv_cache.dtype", kv_cache.dtype)
    check_same("slot_mapping length", slot_mapping.shape[0], "num_tokens", k.shape[0])
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        kv_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        kv_cache[0].numel(),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=4,
    )
