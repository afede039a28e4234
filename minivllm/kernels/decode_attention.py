"""Decode attention (one query token per request) over the paged KV cache, with split-KV.

Each program reads a K/V tile once for all query heads of its GQA group (`tl.dot` with the
group padded to 16 rows). Split-KV (flash-decoding) adds a partition grid axis and a reduce.
Requests can be launched longest first (`order`), so that the short ones fill the SMs at the
end of the kernel.
An fp8 cache is converted to q's dtype tile by tile; its scales are folded into the softmax
scale (K) and the output (V).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import (
    LOG2E,
    check_kv_scales,
    check_paged_attention,
    check_same,
    check_tensor,
)
from minivllm.kernels.e4m3_asm import check_e4m3_asm, e4m3_asm_unsupported, e4m3_to_f16_asm
from minivllm.kernels.float32_dot import dot
from minivllm.kernels.tiling import fit_attention_tiles

MAX_SPLITS = 16
_MAX_GRID_Y = 65535  # CUDA's limit on the grid's second axis, the requests'
# head_dim bound -> (BLOCK_N tokens per iteration, num_warps, num_stages)
_CONFIGS = ((64, (64, 4, 3)), (128, (64, 4, 3)), (256, (32, 8, 2)))


def decode_config(head_dim: int, elem_size: int = 2) -> tuple[int, int, int]:
    """(block_n, num_warps, num_stages); elem_size 4 (float32) gets tiles that still fit."""
    for bound, (block_n, num_warps, num_stages) in _CONFIGS:
        if head_dim <= bound:
            block_d = triton.next_power_of_2(head_dim)
            _, block_n, num_stages = fit_attention_tiles(
                elem_size, block_d, 16, block_n, num_stages
            )
            return block_n, num_warps, num_stages
    raise ValueError(f"head_dim {head_dim} > 256 is not supported")


def choose_num_splits(
    num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int, max_splits: int = MAX_SPLITS
) -> int:
    """Partitions per request so that num_seqs * num_kv_heads * splits fills ~2 waves of SMs;
    1 (no split) once the batch alone fills the GPU or contexts are short."""
    programs = num_seqs * num_kv_heads
    if programs >= num_sms:
        return 1
    by_occupancy = triton.cdiv(2 * num_sms, programs)
    by_length = triton.cdiv(max_seq_len, 256)  # keep >= ~256 tokens per partition
    return max(1, min(max_splits, by_occupancy, by_length))


# The block table's row stride changes with the batch: no value/alignment specialization for
# it (or for the metadata pointers, which may be slices), so a new batch shape never triggers
# a JIT compile. num_splits stays specialized: it takes at most MAX_SPLITS values, and
# specializing it is faster for small split batches (measured: docs/performance.md).
@triton.jit(
    do_not_specialize=["stride_bt"],
    do_not_specialize_on_alignment=["block_table_ptr", "seq_lens_ptr", "order_ptr"],
)
def _decode_kernel(
    q_ptr,
    cache_ptr,
    block_table_ptr,
    seq_lens_ptr,
    order_ptr,
    out_ptr,
    mid_o_ptr,
    mid_lse_ptr,
    scale_log2e,
    v_scale,
    num_splits,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    stride_mo_t,
    stride_mo_h,
    stride_mo_s,
    stride_ml_t,
    stride_ml_h,
    v_cache_offset,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLIT: tl.constexpr,
    KV_FP8: tl.constexpr,
    V_CVT_ASM: tl.constexpr,
    HAS_ORDER: tl.constexpr,
):
    """Grid (num_kv_heads, num_seqs, num_splits). Program (h, i, s) attends the GROUP query
    heads of kv head h of request b = order[i] (HAS_ORDER; else b = i) over partition s of its
    context. Programs start in grid order, heads fastest: with the requests longest first, the
    last programs to start are the shortest, and no SM is left with a long one at the end.
    SPLIT: write the partition's normalized output and log2-sum-exp to mid_o/mid_lse, else
    straight to out.
    KV_FP8: K/V tiles are e4m3 (k_scale already in scale_log2e, v_scale applied at the end);
    V_CVT_ASM: V converted by e4m3_to_f16_asm (q must then be fp16 here)."""
    kv_head = tl.program_id(0)
    if HAS_ORDER:
        seq = tl.load(order_ptr + tl.program_id(1))
    else:
        seq = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    # Partition length is derived from the live seq_len, so a captured grid stays correct.
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_g
    seq64 = seq.to(tl.int64)
    q = tl.load(
        q_ptr + seq64 * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )  # [BLOCK_G, BLOCK_D]
    if KV_FP8 and q.dtype == tl.bfloat16:
        # e4m3 -> fp16 is one cvt per pair on sm_89+ (-> bf16 is not): both dots in fp16.
        q = q.to(tl.float16)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    block_table = block_table_ptr + seq64 * stride_bt
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + offs_n
        valid = pos < end
        block_ids = tl.load(block_table + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        slots = block_ids * BLOCK_SIZE + pos % BLOCK_SIZE
        rows = cache_ptr + slots[:, None] * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM
        kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(rows + offs_d[None, :], mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        if KV_FP8:
            k = k.to(q.dtype)
        s = dot(q, tl.trans(k)) * scale_log2e  # [BLOCK_G, BLOCK_N]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(rows + v_cache_offset + offs_d[None, :], mask=kv_mask, other=0.0)
        if V_CVT_ASM:
            v = e4m3_to_f16_asm(v)
        elif KV_FP8:
            v = v.to(q.dtype)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v)
        m_i = m_new

    # An empty partition (or seq_len 0) has l_i == 0: output 0, lse -inf (weight 0 in reduce).
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    if KV_FP8:
        o = o * v_scale
    out_mask = g_mask[:, None] & d_mask[None, :]
    if SPLIT:
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_safe))
        mid = seq64 * stride_mo_t + heads * stride_mo_h + split * stride_mo_s
        tl.store(mid_o_ptr + mid[:, None] + offs_d[None, :], o, mask=out_mask)
        tl.store(mid_lse_ptr + seq64 * stride_ml_t + heads * stride_ml_h + split, lse, mask=g_mask)
    else:
        dst = out_ptr + seq64 * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _reduce_kernel(
    mid_o_ptr,
    mid_lse_ptr,
    out_ptr,
    num_splits,
    stride_mo_t,
    stride_mo_h,
    stride_mo_s,
    stride_ml_t,
    stride_ml_h,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Grid (num_seqs, num_heads): merges the partitions of one (request, head) by their lse."""
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    d_mask = offs_d < HEAD_DIM
    lse = tl.load(
        mid_lse_ptr + seq * stride_ml_t + head * stride_ml_h + offs_s,
        mask=s_mask,
        other=float("-inf"),
    )
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # seq_len 0: every partition empty
    w = tl.exp2(lse - m)  # [BLOCK_S]
    denom = tl.sum(w, 0)
    denom = tl.where(denom == 0.0, 1.0, denom)
    mid = seq * stride_mo_t + head * stride_mo_h + offs_s * stride_mo_s
    o = tl.load(
        mid_o_ptr + mid[:, None] + offs_d[None, :],
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    )  # [BLOCK_S, BLOCK_D]
    res = tl.sum(o * w[:, None], 0) / denom
    dst = out_ptr + seq * stride_ot + head * stride_oh + offs_d
    tl.store(dst, res.to(out_ptr.dtype.element_ty), mask=d_mask)


def _check_scratch(mid_o, mid_lse, q, num_splits) -> None:
    if mid_o is None or mid_lse is None:
        raise ValueError("num_splits > 1 needs mid_o and mid_lse scratch buffers")
    check_tensor("mid_o", mid_o, 4, (torch.float32,))
    check_tensor("mid_lse", mid_lse, 3, (torch.float32,), inner_contiguous=False)
    num_seqs, num_heads, head_dim = q.shape
    if (
        mid_o.shape[0] < num_seqs
        or tuple(mid_o.shape[1::2]) != (num_heads, head_dim)
        or mid_o.shape[2] < num_splits
    ):
        raise ValueError(
            f"mid_o must be [>= {num_seqs}, {num_heads}, >= {num_splits}, {head_dim}], "
            f"got {tuple(mid_o.shape)}"
        )
    if tuple(mid_lse.shape) != tuple(mid_o.shape[:3]) or mid_lse.stride(2) != 1:
        raise ValueError(f"mid_lse must be [{mid_o.shape[:3]}] with unit last stride")


def decode_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    num_splits: int = 1,
    mid_o: torch.Tensor | None = None,
    mid_lse: torch.Tensor | None = None,
    config: tuple[int, int, int] | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    v_cvt_asm: bool | None = None,
    order: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one query token per request over its paged context; writes and returns out.

    q, out: [num_seqs, num_heads, head_dim] (last dim contiguous). kv_cache: [2, num_blocks,
    block_size, num_kv_heads, head_dim], block_size any power of two. block_tables: [num_seqs,
    max_num_blocks] int32. seq_lens: [num_seqs] int32, context incl. the query token (0 allowed:
    output 0). num_splits > 1 uses mid_o [>= num_seqs, num_heads, >= num_splits, head_dim] and
    mid_lse [>= num_seqs, num_heads, >= num_splits] float32 scratch. No host syncs and no
    allocation: CUDA-graph capturable for a fixed num_splits. config: (block_n, num_warps,
    num_stages) overrides the per-head_dim table (benchmark sweeps). A float8_e4m3fn kv_cache
    holds K / k_scale and V / v_scale (store_kv); other caches take scales of 1.0.
    v_cvt_asm: convert fp8 V tiles by inline PTX (e4m3_to_f16_asm); None (the default) does
    wherever it can run (an fp8 cache, a 16-bit q, CUDA sm_89+), being faster than the plain
    cast. True insists (ValueError where it cannot), False is the plain cast.
    order: [num_seqs] int32, a permutation of the requests: the order their programs start in.
    Longest context first balances the SMs over a batch of mixed lengths (measured:
    docs/performance.md, `bench_kernels.py --only mixed_`); None: row order.
    """
    check_paged_attention(q, kv_cache, block_tables, seq_lens, out)
    is_fp8 = check_kv_scales(kv_cache, k_scale, v_scale)
    if v_cvt_asm is None:
        v_cvt_asm = e4m3_asm_unsupported(q, is_fp8) is None
    elif v_cvt_asm:
        check_e4m3_asm("v_cvt_asm", q, is_fp8)
    check_same("seq_lens length", seq_lens.shape[0], "num_seqs", q.shape[0])
    if order is not None:
        check_tensor("order", order, 1, (torch.int32,))
        check_same("order length", order.shape[0], "num_seqs", q.shape[0])
        if order.device != q.device:
            raise ValueError(f"order must be on {q.device}, got {order.device}")
    if not 1 <= num_splits <= 256:
        raise ValueError(f"num_splits must be in [1, 256], got {num_splits}")
    split = num_splits > 1
    if split:
        _check_scratch(mid_o, mid_lse, q, num_splits)
    else:
        mid_o, mid_lse = out, out  # unused by the kernel
    num_seqs, num_heads, head_dim = q.shape
    if num_seqs == 0:
        return out
    if num_seqs > _MAX_GRID_Y:
        raise ValueError(f"at most {_MAX_GRID_Y} requests per launch (grid y), got {num_seqs}")
    num_kv_heads = kv_cache.shape[3]
    group = num_heads // num_kv_heads
    elem_size = max(q.element_size(), kv_cache.element_size())  # fp8 tiles become q's dtype
    block_n, num_warps, num_stages = config or decode_config(head_dim, elem_size)
    if is_fp8 and config is None:
        block_n *= 2  # the same bytes per K/V tile as a 16-bit cache (fastest in the H200 sweep)
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    mo_strides = mid_o.stride()[:3] if split else (0, 0, 0)
    ml_strides = mid_lse.stride()[:2] if split else (0, 0)
    _decode_kernel[(num_kv_heads, num_seqs, num_splits)](
        q, kv_cache, block_tables, seq_lens, seq_lens if order is None else order,
        out, mid_o, mid_lse,
        scale * LOG2E * k_scale, v_scale, num_splits,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        *mo_strides, *ml_strides, kv_cache[0].numel(),
        NUM_KV_HEADS=num_kv_heads, GROUP=group, HEAD_DIM=head_dim,
        BLOCK_SIZE=kv_cache.shape[2], BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(head_dim), SPLIT=split, KV_FP8=is_fp8,
        V_CVT_ASM=v_cvt_asm, HAS_ORDER=order is not None, num_warps=num_warps,
        num_stages=num_stages,
    )  # fmt: skip
    if split:
        _reduce_kernel[(num_seqs, num_heads)](
            mid_o, mid_lse, out, num_splits,
            *mo_strides, *ml_strides, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_S=triton.next_power_of_2(num_splits),
            BLOCK_D=triton.next_power_of_2(head_dim), num_warps=4,
        )  # fmt: skip
    return out
