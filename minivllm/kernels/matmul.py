"""Batch-invariant GEMM for deterministic mode: y = x @ w.T (+ b), each output element reduced
over K in one fixed order (BLOCK_K steps, no split-K); tiles from kernels/matmul_configs.py.

cuBLAS picks kernels (and split-K) by shape, so a row's bits can change with the number of
rows computed beside it; here a row's result depends only on that row, w and b.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_same, check_tensor
from minivllm.kernels.matmul_configs import (
    Buckets,
    Config,
    bucket_config,
    check_buckets,
    matmul_config,
)

GROUP_M = 8  # row tiles that share a column band (L2 reuse of w)


@triton.jit
def tile_origin(t, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    """(first row, first column) of output tile t of an [M, N] product, tiles grouped along M:
    GROUP row tiles run through a column band together, which keeps that band of w in L2.
    Scalar code: Gluon kernels call it too."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    band = GROUP * num_n
    first_m = t // band * GROUP
    size_m = tl.minimum(num_m - first_m, GROUP)
    return (first_m + (t % band) % size_m) * BLOCK_M, (t % band) // size_m * BLOCK_N


@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),), grouped along M for L2 reuse. Program
    computes one [BLOCK_M, BLOCK_N] tile: acc += x[:, k:k+BLOCK_K] @ w[:, k:k+BLOCK_K].T for
    k = 0, BLOCK_K, ... in order, in float32."""
    row0, col0 = tile_origin(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP)
    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_n = col0 + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n.to(tl.int64)[None, :] * stride_wn + offs_k[:, None]  # [BK, BN]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=n_mask[None, :], other=0.0)
        else:
            k_mask = offs_k < K - k0
            x = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    dst = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
    tl.store(dst, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: Config | None = None,
    buckets: Buckets | None = None,
) -> torch.Tensor:
    """F.linear(x, weight, bias), batch-invariant. x: [..., K], weight: [N, K] (last dims
    contiguous), bias: [N] or None; returns [..., N] in x.dtype. float32 uses IEEE products
    (no TF32), as torch does by default. Tiles: `matmul_config` (the shape's M buckets, or the
    rule); config (block_m, block_n, block_k, num_warps, num_stages) fixes one for every M,
    buckets ((max_m, config), ...) replaces the shape's table entry (tests, tuning)."""
    check_tensor("weight", weight, 2)
    check_same("x.dtype", x.dtype, "weight.dtype", weight.dtype)
    check_same("x last dim", x.shape[-1], "weight in_features", weight.shape[1])
    if bias is not None:
        check_tensor("bias", bias, 1)
        check_same("bias length", bias.shape[0], "weight out_features", weight.shape[0])
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    (M, K), N = x2.shape, weight.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y.reshape(*lead, N)
    if config is None and buckets is not None:
        check_buckets(buckets)
        config = bucket_config(buckets, M)
    block_m, block_n, block_k, num_warps, num_stages = config or matmul_config(x.dtype, N, K, M)
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    _matmul_kernel[grid](
        x2, weight, y if bias is None else bias, y, M, N, K,
        x2.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, EVEN_K=K % block_k == 0, IEEE=x.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP=GROUP_M,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return y.reshape(*lead, N)
