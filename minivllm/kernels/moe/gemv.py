"""The experts of a small step (a decode of a few tokens) in two launches, without alignment:
each (token, expert) pair reads its expert's weight rows directly (a GEMV over K, no row
block padded for tl.dot). Gate/up with SiLU-and-mul, then down with the top-k weights applied
and each token's sum over its top-k in order. Block FP8: x and the activation quantized per
group of 128 in registers, as `quantize_token_groups` does. Which steps take it: `configs.py`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_same, check_tensor
from minivllm.kernels.fp8_gemm_configs import BLOCK_K as FP8_BLOCK_K
from minivllm.kernels.fp8_gemm_configs import FP8_MAX, SCALE_EPS
from minivllm.kernels.moe.configs import MoeGemvConfig


@triton.jit
def _load_row_chunk(ptr, k_mask, EVEN_K: tl.constexpr, FP8: tl.constexpr, FP8_MAX: tl.constexpr,
                    EPS: tl.constexpr):  # fmt: skip
    """A BLOCK_K chunk of an input row in float32; FP8: quantized to e4m3 as one group of 128
    and dequantized (q * s), the values the block-FP8 GEMMs multiply."""
    if EVEN_K:
        v = tl.load(ptr).to(tl.float32)
    else:
        v = tl.load(ptr, mask=k_mask, other=0.0).to(tl.float32)
    if FP8:
        scale = tl.maximum(tl.max(tl.abs(v), 0), EPS) / FP8_MAX
        q = tl.clamp(tl.div_rn(v, scale), -FP8_MAX, FP8_MAX).to(tl.float8e4nv)
        v = q.to(tl.float32) * scale
    return v


@triton.jit
def _load_tile(ptrs, n_mask, k_mask, EVEN_K: tl.constexpr):
    if EVEN_K:
        return tl.load(ptrs, mask=n_mask[:, None], other=0.0).to(tl.float32)
    return tl.load(ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)


@triton.jit
def _gate_up_gemv_kernel(
    x_ptr, w_ptr, ids_ptr, out_ptr, ws_ptr, N, K,
    stride_xm, stride_we, stride_wn, stride_om, stride_wse, stride_wsn,
    NUM_EXPERTS: tl.constexpr, TOP_K: tl.constexpr, EVEN_K: tl.constexpr, FP8: tl.constexpr,
    FP8_MAX: tl.constexpr, EPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):  # fmt: skip
    """Grid (num_pairs, cdiv(N, BLOCK_N)), pairs fastest: the pairs on one expert read its
    tile at about the same time, and L2 serves the repeats. Pair p: token p // TOP_K, expert
    e = ids[p]; out[p, n] = silu(g) * u with g = w[e, n] . x[t] and u = w[e, N + n] . x[t],
    float32 over K in BLOCK_K steps, NUM_STAGES of them loading ahead. FP8 (BLOCK_K 128,
    BLOCK_N dividing 128, N a multiple of 128): each step's weights times their block's scale
    ws[e, n // 128, k // 128]."""
    pair = tl.program_id(0)
    # A NaN row's router ids can be out of range: its reads stay inside w.
    expert = tl.minimum(tl.load(ids_ptr + pair), NUM_EXPERTS - 1).to(tl.int64)
    token = (pair // TOP_K).to(tl.int64)
    n0 = tl.program_id(1) * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + token * stride_xm + offs_k
    w_ptrs = w_ptr + expert * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn
    w_ptrs += offs_k[None, :]  # [BLOCK_N, BLOCK_K]
    up_offset = N * stride_wn  # the up rows (< 2^31 elements into an expert)
    ws_ptr += expert * stride_wse + (n0 // 128) * stride_wsn
    ws_up_ptr = ws_ptr + (N // 128) * stride_wsn
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        k_mask = offs_k < K - k0
        x = _load_row_chunk(x_ptrs, k_mask, EVEN_K, FP8, FP8_MAX, EPS)
        x_up = x
        if FP8:
            x_up = x * tl.load(ws_up_ptr + k0 // BLOCK_K)
            x = x * tl.load(ws_ptr + k0 // BLOCK_K)
        acc += _load_tile(w_ptrs, n_mask, k_mask, EVEN_K) * x[None, :]
        acc_up += _load_tile(w_ptrs + up_offset, n_mask, k_mask, EVEN_K) * x_up[None, :]
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    gate = tl.sum(acc, 1)
    act = gate / (1.0 + tl.exp(-gate)) * tl.sum(acc_up, 1)
    dst = out_ptr + pair.to(tl.int64) * stride_om + offs_n
    tl.store(dst, act.to(out_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _down_gemv_kernel(
    a_ptr, w_ptr, ids_ptr, weights_ptr, out_ptr, ws_ptr, N, K,
    stride_am, stride_we, stride_wn, stride_om, stride_wse, stride_wsn,
    NUM_EXPERTS: tl.constexpr, TOP_K: tl.constexpr, EVEN_K: tl.constexpr, FP8: tl.constexpr,
    FP8_MAX: tl.constexpr, EPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):  # fmt: skip
    """Grid (num_tokens, cdiv(N, BLOCK_N)), tokens fastest. For k = 0, 1, ... in order, pair
    p = t * TOP_K + k, e = ids[p]: y = weights[p] * (w[e, n] . a[p]) (float32 over K in
    BLOCK_K steps), rounded to out's dtype as the grouped path stores it, and added in float32
    to the token's sum. One loop over the top-k's K steps, NUM_STAGES loading ahead across
    experts (a loop per expert would drain its loads at each one). FP8: as the gate/up kernel,
    a's groups quantized in registers."""
    token = tl.program_id(0).to(tl.int64)
    n0 = tl.program_id(1) * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    w_rows = offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    num_steps = tl.cdiv(K, BLOCK_K)
    acc = tl.zeros([BLOCK_N], tl.float32)  # the current expert's dot products so far
    total = tl.zeros([BLOCK_N], tl.float32)
    for i in tl.range(0, TOP_K * num_steps, num_stages=NUM_STAGES):
        pair = token * TOP_K + i // num_steps
        k0 = (i % num_steps) * BLOCK_K
        expert = tl.minimum(tl.load(ids_ptr + pair), NUM_EXPERTS - 1).to(tl.int64)
        k_mask = offs_k < K - k0
        a = _load_row_chunk(a_ptr + pair * stride_am + k0 + offs_k, k_mask, EVEN_K, FP8, FP8_MAX,
                            EPS)  # fmt: skip
        if FP8:
            a = a * tl.load(ws_ptr + expert * stride_wse + (n0 // 128) * stride_wsn + k0 // 128)
        w = _load_tile(w_ptr + expert * stride_we + w_rows + k0, n_mask, k_mask, EVEN_K)
        acc += tl.sum(w * a[None, :], 1)
        y = (acc * tl.load(weights_ptr + pair)).to(out_ptr.dtype.element_ty).to(tl.float32)
        last = k0 + BLOCK_K >= K  # the expert's last step: its output joins the sum
        total = tl.where(last, total + y, total)
        acc = tl.where(last, 0.0, acc)
    dst = out_ptr + token * stride_om + offs_n
    tl.store(dst, total.to(out_ptr.dtype.element_ty), mask=n_mask)


def moe_gemv(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: MoeGemvConfig,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """`fused_moe`'s contract (inputs checked there), in two launches. scales: block FP8,
    (w13_scale [E, 2I / 128, cdiv(H, 128)], w2_scale [E, cdiv(H, 128), I / 128])."""
    num_tokens, top_k = topk_ids.shape
    num_experts, hidden, inter = w2.shape
    fp8 = scales is not None
    if fp8:
        _check_fp8(config, w13, w2, scales)
    else:
        check_same("x.dtype", x.dtype, "w13.dtype", w13.dtype)
        check_same("w2.dtype", w2.dtype, "w13.dtype", w13.dtype)
    if not (w13.is_contiguous() and w2.is_contiguous()):
        raise ValueError("w13 and w2 must be contiguous: [num_experts, N, K]")
    w13_scale, w2_scale = scales if fp8 else (w13, w2)  # (placeholders the kernels skip)
    ids = topk_ids.reshape(-1).contiguous()
    act = torch.empty(num_tokens * top_k, inter, dtype=x.dtype, device=x.device)
    out = torch.empty(num_tokens, hidden, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    constants = {"NUM_EXPERTS": num_experts, "TOP_K": top_k, "FP8": fp8, "FP8_MAX": FP8_MAX,
                 "EPS": SCALE_EPS}  # fmt: skip
    up = config.gate_up
    _gate_up_gemv_kernel[(num_tokens * top_k, triton.cdiv(inter, up.block_n))](
        x, w13, ids, act, w13_scale, inter, hidden,
        x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
        w13_scale.stride(0), w13_scale.stride(1), **constants,
        EVEN_K=hidden % up.block_k == 0, BLOCK_N=up.block_n, BLOCK_K=up.block_k,
        NUM_STAGES=up.num_stages, num_warps=up.num_warps,
    )  # fmt: skip
    down = config.down
    _down_gemv_kernel[(num_tokens, triton.cdiv(hidden, down.block_n))](
        act, w2, ids, topk_weights.contiguous(), out, w2_scale, hidden, inter,
        act.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
        w2_scale.stride(0), w2_scale.stride(1), **constants,
        EVEN_K=inter % down.block_k == 0, BLOCK_N=down.block_n, BLOCK_K=down.block_k,
        NUM_STAGES=down.num_stages, num_warps=down.num_warps,
    )  # fmt: skip
    return out


def _check_fp8(config: MoeGemvConfig, w13, w2, scales) -> None:
    """The scales' shapes; a step's K chunk is one quantization group and its N tile sits in
    one scale block."""
    for name, w, scale in (("w13_scale", w13, scales[0]), ("w2_scale", w2, scales[1])):
        check_tensor(name, scale, 3, (torch.float32,))
        rows, cols = (triton.cdiv(n, FP8_BLOCK_K) for n in w.shape[1:])
        blocks = (w.shape[0], rows, cols)
        check_same(f"{name} shape", tuple(scale.shape), "[E, N blocks, K blocks]", blocks)
    inter = w2.shape[2]
    if inter % FP8_BLOCK_K:
        raise ValueError(f"block-FP8 GEMV needs the intermediate size ({inter}) to be a "
                         f"multiple of {FP8_BLOCK_K}")  # fmt: skip
    for name, tile in (("gate_up", config.gate_up), ("down", config.down)):
        check_same(f"{name} block_k of a block-FP8 GEMV", tile.block_k, "the FP8 block",
                   FP8_BLOCK_K)  # fmt: skip
        if FP8_BLOCK_K % tile.block_n:
            raise ValueError(f"{name} block_n ({tile.block_n}) must divide {FP8_BLOCK_K}")
