"""The experts' grouped GEMM: each program multiplies one row block of pairs (all routed to
one expert, `align.py`) by a column tile of that expert's weight. Two uses: gate/up with
SiLU-and-mul fused (rows of x gathered by token), and down with the top-k weights applied
(rows of the activation by pair). Block FP8 (`scales`): e4m3 a and w, each 128-wide K step's
product scaled by the rows' token-group scales and the weight's 128 x 128 block scales."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import FLOAT_DTYPES, check_same, check_tensor
from minivllm.kernels.fp8_gemm_configs import BLOCK_K as FP8_BLOCK_K
from minivllm.kernels.moe.align import ExpertBlocks
from minivllm.kernels.moe.configs import GemmTile

FP8_DTYPE = torch.float8_e4m3fn


@triton.jit
def _step(a, w, acc, a_scale, w_scale, IEEE: tl.constexpr, FP8: tl.constexpr):
    """One K step: acc += a @ w; FP8: the step's product, scaled by rows and columns."""
    if FP8:
        acc += tl.dot(a, w) * a_scale[:, None] * w_scale[None, :]
    elif IEEE:
        acc = tl.dot(a, w, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, w, acc)
    return acc


@triton.jit(do_not_specialize=["num_pairs"])
def _grouped_gemm_kernel(
    a_ptr, w_ptr, out_ptr, pair_ids_ptr, block_experts_ptr, num_padded_ptr, weights_ptr,
    a_scale_ptr, w_scale_ptr,
    num_pairs, N, K, stride_am, stride_we, stride_wn, stride_om,
    stride_asm, stride_wse, stride_wsn,
    ROWS_PER_A: tl.constexpr, GATED: tl.constexpr, WEIGHTED: tl.constexpr,
    EVEN_K: tl.constexpr, IEEE: tl.constexpr, FP8: tl.constexpr, SCALE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Grid (max_padded // BLOCK_M * cdiv(N, BLOCK_N),), column tiles fastest (a row block's
    programs read the same rows of a and the same expert). Row i of the block is pair
    p = pair_ids[i], its a row p // ROWS_PER_A, its output row p. Over K in BLOCK_K steps, in
    order, float32: acc = a_row @ w[e, n].T. GATED: w holds 2N rows (gate, then up) and the
    output is silu(gate) * up. WEIGHTED: the output is multiplied by weights[p]. FP8 (BLOCK_K
    128): step kb's product times a_scale[a_row, kb] * w_scale[e, n // SCALE_N, kb]."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    block = pid // num_n
    if block * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_experts_ptr + block).to(tl.int64)
    pairs = tl.load(pair_ids_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    m_mask = pairs < num_pairs
    rows = (pairs // ROWS_PER_A).to(tl.int64)
    offs_n = (pid % num_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + expert * stride_we + offs_n.to(tl.int64)[None, :] * stride_wn
    w_ptrs += offs_k[:, None]  # [BLOCK_K, BLOCK_N]: w[e].T's tile
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    as_ptrs = a_scale_ptr + rows * stride_asm
    ws_ptrs = w_scale_ptr + expert * stride_wse + (offs_n // SCALE_N) * stride_wsn
    ws_up_ptrs = w_scale_ptr + expert * stride_wse + ((offs_n + N) // SCALE_N) * stride_wsn
    a_scale = tl.zeros([BLOCK_M], tl.float32)  # the scales: read only when FP8
    w_scale = tl.zeros([BLOCK_N], tl.float32)
    w_scale_up = w_scale
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a_mask = m_mask[:, None]
            w_mask = n_mask[None, :]
        else:
            k_mask = offs_k < K - k0
            a_mask = m_mask[:, None] & k_mask[None, :]
            w_mask = k_mask[:, None] & n_mask[None, :]
        a = tl.load(a_ptrs, mask=a_mask, other=0.0)
        w = tl.load(w_ptrs, mask=w_mask, other=0.0)
        if FP8:
            kb = k0 // BLOCK_K
            a_scale = tl.load(as_ptrs + kb, mask=m_mask, other=0.0)
            w_scale = tl.load(ws_ptrs + kb, mask=n_mask, other=0.0)
        acc = _step(a, w, acc, a_scale, w_scale, IEEE, FP8)
        if GATED:
            w_up = tl.load(w_ptrs + N * stride_wn, mask=w_mask, other=0.0)
            if FP8:
                w_scale_up = tl.load(ws_up_ptrs + k0 // BLOCK_K, mask=n_mask, other=0.0)
            acc_up = _step(a, w_up, acc_up, a_scale, w_scale_up, IEEE, FP8)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if WEIGHTED:
        acc *= tl.load(weights_ptr + pairs, mask=m_mask, other=0.0).to(tl.float32)[:, None]
    dst = out_ptr + pairs.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def grouped_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    blocks: ExpertBlocks,
    tile: GemmTile,
    rows_per_a: int,
    gated: bool,
    weights: torch.Tensor | None = None,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """a: [num_pairs // rows_per_a, K] (x by token: rows_per_a = top_k; or by pair: 1);
    w: [E, N, K], or [E, 2N, K] gate rows then up rows when gated; weights: [num_pairs]
    float32 or None. Returns [num_pairs, N] in out_dtype (default a.dtype), row p for pair p.
    scales: block FP8, a and w e4m3 with (a_scale [rows of a, cdiv(K, 128)], w_scale [E,
    cdiv(rows of w, 128), cdiv(K, 128)]) float32; the tile's block_k must be 128."""
    fp8 = scales is not None
    check_tensor("a", a, 2, (FP8_DTYPE,) if fp8 else FLOAT_DTYPES)
    check_tensor("w", w, 3, (FP8_DTYPE,) if fp8 else FLOAT_DTYPES)
    check_same("a.dtype", a.dtype, "w.dtype", w.dtype)
    check_same("a last dim", a.shape[1], "w last dim", w.shape[2])
    if not w.is_contiguous():
        raise ValueError("w must be contiguous: [num_experts, N, K]")
    a_scale, w_scale = scales if fp8 else (a, w)  # (placeholders the kernel does not read)
    if fp8:
        _check_scales(a, w, a_scale, w_scale, tile)
    n = w.shape[1] // 2 if gated else w.shape[1]
    out = torch.empty(blocks.num_pairs, n, dtype=out_dtype or a.dtype, device=a.device)
    if blocks.num_pairs == 0:
        return out
    if weights is not None:
        check_tensor("weights", weights, 1, (torch.float32,))
        check_same("weights length", weights.shape[0], "num_pairs", blocks.num_pairs)
    k = a.shape[1]
    num_blocks = blocks.pair_ids.shape[0] // blocks.block_m
    grid = (num_blocks * triton.cdiv(n, tile.block_n),)
    _grouped_gemm_kernel[grid](
        a, w, out, blocks.pair_ids, blocks.block_experts, blocks.num_padded,
        out if weights is None else weights, a_scale, w_scale,
        blocks.num_pairs, n, k, a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        a_scale.stride(0), w_scale.stride(0), w_scale.stride(1),
        ROWS_PER_A=rows_per_a, GATED=gated, WEIGHTED=weights is not None,
        EVEN_K=k % tile.block_k == 0, IEEE=a.dtype == torch.float32, FP8=fp8, SCALE_N=128,
        BLOCK_M=blocks.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )  # fmt: skip
    return out


def _check_scales(a, w, a_scale, w_scale, tile: GemmTile) -> None:
    check_same("block_k of a block-FP8 GEMM", tile.block_k, "the FP8 block", FP8_BLOCK_K)
    k_blocks = triton.cdiv(a.shape[1], FP8_BLOCK_K)
    check_tensor("a_scale", a_scale, 2, (torch.float32,))
    check_tensor("w_scale", w_scale, 3, (torch.float32,))
    check_same("a_scale shape", tuple(a_scale.shape), "[rows, K blocks]", (a.shape[0], k_blocks))
    blocks = (w.shape[0], triton.cdiv(w.shape[1], FP8_BLOCK_K), k_blocks)
    check_same("w_scale shape", tuple(w_scale.shape), "[E, N blocks, K blocks]", blocks)
    if not w_scale.is_contiguous():
        raise ValueError("w_scale must be contiguous")
