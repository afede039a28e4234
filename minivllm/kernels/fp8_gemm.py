"""Block-scaled FP8 GEMM (W8A8, the layout of Qwen's and DeepSeek's FP8 checkpoints):
y = (xq * xs) @ (wq * ws).T (+ b). The weight is e4m3 with one float32 scale per 128 x 128 block;
the activations are quantized here, per token and group of 128 along K, on the fly.

Each output element is reduced over K in 128-wide steps, in order, in float32 (no split-K): a
row's result depends on its tile config, never on the other rows; deterministic mode fixes one
config per weight shape (kernels/fp8_gemm_configs.py), so a row's bits do not depend on M.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_same, check_tensor
from minivllm.kernels.fp8_gemm_configs import (
    BLOCK_K,
    FP8_MAX,
    GROUP_SIZE,
    SCALE_EPS,
    Fp8Config,
    fp8_gemm_config,
)
from minivllm.kernels.matmul import GROUP_M, tile_origin

FP8_DTYPE = torch.float8_e4m3fn
GROUPS_PER_PROGRAM = 4


@triton.jit
def _token_group_quant_kernel(
    x_ptr, q_ptr, s_ptr, K, num_groups, stride_xm, stride_qm, stride_sm,
    GROUP: tl.constexpr, GROUPS: tl.constexpr, FP8_MAX: tl.constexpr, EPS: tl.constexpr,
):  # fmt: skip
    """Grid (M, cdiv(num_groups, GROUPS)): a program quantizes GROUPS groups of one row:
    s = max(|x|, EPS) / FP8_MAX over the group, q = clamp(x / s) in e4m3. The division rounds
    to nearest (div_rn, as torch divides): Triton's default fp32 division is approximate, and
    an ulp's difference can move a value across an e4m3 rounding boundary."""
    row = tl.program_id(0).to(tl.int64)
    groups = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    offs = groups[:, None] * GROUP + tl.arange(0, GROUP)[None, :]  # [GROUPS, GROUP]
    mask = offs < K
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=1), EPS) / FP8_MAX  # [GROUPS]
    q = tl.clamp(tl.div_rn(x, scale[:, None]), -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + row * stride_qm + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * stride_sm + groups, scale, mask=groups < num_groups)


def quantize_token_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] (float) -> (q [M, K] e4m3, s [M, cdiv(K, 128)] float32), x ~= q * s per group
    of 128 along K."""
    check_tensor("x", x, 2)
    M, K = x.shape
    num_groups = triton.cdiv(K, GROUP_SIZE)
    q = torch.empty(M, K, dtype=FP8_DTYPE, device=x.device)
    s = torch.empty(M, num_groups, dtype=torch.float32, device=x.device)
    if M == 0:
        return q, s
    grid = (M, triton.cdiv(num_groups, GROUPS_PER_PROGRAM))
    _token_group_quant_kernel[grid](
        x, q, s, K, num_groups, x.stride(0), q.stride(0), s.stride(0),
        GROUP=GROUP_SIZE, GROUPS=GROUPS_PER_PROGRAM, FP8_MAX=FP8_MAX, EPS=SCALE_EPS,
    )  # fmt: skip
    return q, s


@triton.jit(do_not_specialize=["M"])
def _block_fp8_matmul_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, b_ptr, y_ptr, M, N, K,
    stride_xm, stride_xsm, stride_wn, stride_wsn, stride_ym,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, SCALE_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),), grouped along M for L2 reuse of w. Step kb:
    acc += dot(xq[:, kb], wq[:, kb].T) * xs[:, kb] * ws[n // SCALE_N, kb], kb in order."""
    row0, col0 = tile_origin(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP)
    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_n = col0 + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n.to(tl.int64)[None, :] * stride_wn + offs_k[:, None]  # [BK, BN]
    xs_ptrs = xs_ptr + offs_m.to(tl.int64) * stride_xsm
    ws_ptrs = ws_ptr + (offs_n // SCALE_N) * stride_wsn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=n_mask[None, :], other=0.0)
        else:
            k_mask = offs_k < K - kb * BLOCK_K
            x = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        x_scale = tl.load(xs_ptrs + kb, mask=m_mask, other=0.0)
        w_scale = tl.load(ws_ptrs + kb, mask=n_mask, other=0.0)
        # A fresh float32 product per step, scaled, then added: the e4m3 MMA's own
        # accumulator never spans more than one 128-wide step.
        acc += tl.dot(x, w) * x_scale[:, None] * w_scale[None, :]
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    dst = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
    tl.store(dst, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def block_fp8_matmul(
    xq: torch.Tensor,
    xs: torch.Tensor,
    wq: torch.Tensor,
    ws: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    config: Fp8Config,
    scale_n: int = 128,
) -> torch.Tensor:
    """xq [M, K] e4m3, xs [M, cdiv(K, 128)] float32, wq [N, K] e4m3, ws [cdiv(N, scale_n),
    cdiv(K, 128)] float32, bias [N] or None -> y [M, N] in out_dtype."""
    (M, K), N = xq.shape, wq.shape[0]
    block_m, block_n, num_warps, num_stages = config
    y = torch.empty(M, N, dtype=out_dtype, device=xq.device)
    if M == 0 or N == 0:
        return y
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    _block_fp8_matmul_kernel[grid](
        xq, xs, wq, ws, y if bias is None else bias, y, M, N, K,
        xq.stride(0), xs.stride(0), wq.stride(0), ws.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, EVEN_K=K % BLOCK_K == 0, SCALE_N=scale_n,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=BLOCK_K, GROUP=GROUP_M,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return y


def block_fp8_linear(
    x: torch.Tensor,
    wq: torch.Tensor,
    ws: torch.Tensor,
    bias: torch.Tensor | None = None,
    deterministic: bool = False,
    config: Fp8Config | None = None,
) -> torch.Tensor:
    """F.linear(x, dequant(wq, ws), bias) with x quantized per token-group of 128. x: [..., K]
    float, wq: [N, K] e4m3, ws: [cdiv(N, 128), cdiv(K, 128)] float32 (one scale per 128 x 128
    block), bias: [N] or None -> [..., N] in x.dtype. Tiles: `fp8_gemm_config` (one per shape
    when `deterministic`), or `config`."""
    check_tensor("weight", wq, 2, (FP8_DTYPE,))
    check_tensor("weight_scale", ws, 2, (torch.float32,))
    N, K = wq.shape
    check_same("x last dim", x.shape[-1], "weight in_features", K)
    blocks = (triton.cdiv(N, 128), triton.cdiv(K, BLOCK_K))
    check_same("weight_scale shape", tuple(ws.shape), "its 128 x 128 blocks", blocks)
    if bias is not None:
        check_tensor("bias", bias, 1)
        check_same("bias length", bias.shape[0], "weight out_features", N)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    xq, xs = quantize_token_groups(x2)
    config = config or fp8_gemm_config(N, K, x2.shape[0], deterministic)
    y = block_fp8_matmul(xq, xs, wq, ws, bias, x.dtype, config)
    return y.reshape(*lead, N)
