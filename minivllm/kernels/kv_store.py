"""Writes this step's new K/V rows into the paged KV cache at their slots; into an fp8 (e4m3)
cache it quantizes on the way (x / scale, saturated to +-448, rounded to nearest even)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import (
    check_kv_cache,
    check_kv_scales,
    check_same,
    check_tensor,
)


class KVWrite(NamedTuple):
    """Where a kernel other than store_kv writes this step's K/V (RoPE: kernels/rope.py):
    v [num_tokens, num_kv_heads, head_dim] (k is the kernel's own output), the cache, the
    slots (-1: skip the row) and an fp8 cache's scales."""

    v: torch.Tensor
    kv_cache: torch.Tensor
    slot_mapping: torch.Tensor
    k_scale: float = 1.0
    v_scale: float = 1.0


E4M3_MAX = tl.constexpr(448.0)  # largest finite float8_e4m3fn (constexpr: a jit global)


@triton.jit
def _quantize_e4m3(x, scale):
    """x / scale as e4m3, saturating, ties to even: the same bytes as torch's
    `(x.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)`. The rounding is done in
    fp32 so that the final cast is exact: the interpreter's own fp8 cast truncates
    subnormals and rounds ties away, and the bytes must not depend on where this runs."""
    x = tl.div_rn(x.to(tl.float32), scale)
    x = tl.minimum(tl.maximum(x, -E4M3_MAX), E4M3_MAX)
    bits = x.to(tl.int32, bitcast=True)
    # Normal e4m3 keeps 3 of fp32's 23 mantissa bits: round the 20 dropped ones half to even.
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000).to(tl.float32, bitcast=True)
    # Below 2**-6 e4m3 is subnormal, a fixed step of 2**-9: adding 1.5 * 2**14 puts the fp32
    # ulp at 2**-9, so the fp32 adder rounds half to even for us. The sign is put back as a
    # bit (a negated float zero lost it on the GPU: -0 must stay e4m3 0x80, as torch has it).
    sub = (tl.abs(x) + 24576.0) - 24576.0
    sub = (sub.to(tl.int32, bitcast=True) | (bits & -0x80000000)).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(x) < 0.015625, sub, normal).to(tl.float8e4nv)


@triton.jit
def store_rows(dst, x, mask, scale, KV_FP8: tl.constexpr):
    """Stores a tile of K or V rows into cache slots at dst (KV_FP8: quantized by scale).
    Shared by the store kernel and the RoPE kernel that writes K/V itself (kernels/rope.py)."""
    if KV_FP8:
        x = _quantize_e4m3(x, scale)
    tl.store(dst, x, mask=mask)


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
    k_scale,
    v_scale,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """Grid (num_tokens,): one program copies one token's [num_kv_heads, head_dim] K and V
    (KV_FP8: quantized by k_scale / v_scale)."""
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
    store_rows(dst, k, mask, k_scale, KV_FP8)
    store_rows(dst + v_cache_offset, v, mask, v_scale, KV_FP8)


def check_store_inputs(
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float,
    v_scale: float,
) -> bool:
    """store_kv's input checks (also those of RoPE that writes K/V itself); whether the cache
    is fp8."""
    check_tensor("k", k, 3)
    check_tensor("v", v, 3)
    check_kv_cache(kv_cache)
    check_tensor("slot_mapping", slot_mapping, 1, (torch.int64, torch.int32), False)
    check_same("k.shape", tuple(k.shape), "v.shape", tuple(v.shape))
    check_same("k.shape[1:]", tuple(k.shape[1:]), "kv_cache.shape[3:]", tuple(kv_cache.shape[3:]))
    is_fp8 = check_kv_scales(kv_cache, k_scale, v_scale)
    if is_fp8:
        check_same("k.dtype", k.dtype, "v.dtype", v.dtype)
    else:
        check_same("k.dtype", k.dtype, "kv_cache.dtype", kv_cache.dtype)
        check_same("v.dtype", v.dtype, "kv_cache.dtype", kv_cache.dtype)
    check_same("slot_mapping length", slot_mapping.shape[0], "num_tokens", k.shape[0])
    return is_fp8


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Writes k/v rows into kv_cache at slot_mapping; rows whose slot is -1 are skipped.

    k, v: [num_tokens, num_kv_heads, head_dim], last dim contiguous (token/head strides free,
    so views of a fused qkv projection work). kv_cache: [2, num_blocks, block_size,
    num_kv_heads, head_dim], contiguous, same dtype as k, or float8_e4m3fn: then it holds
    k / k_scale and v / v_scale, saturated to +-448 (scales must stay 1.0 otherwise).
    slot_mapping: [num_tokens] int64 (int32 accepted), slot = block_id * block_size + offset.
    """
    is_fp8 = check_store_inputs(k, v, kv_cache, slot_mapping, k_scale, v_scale)
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
        k_scale,
        v_scale,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        KV_FP8=is_fp8,
        num_warps=4,
    )
