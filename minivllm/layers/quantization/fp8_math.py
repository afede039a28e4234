"""Block-wise FP8 in torch: the weights' 128 x 128 block quantization (for quantizing a bf16
checkpoint at load and for tests), the activations' per token-group quantization, and the
dequantizing reference GEMM: the CPU path and the Triton kernel's oracle (kernels/fp8_gemm.py
computes the same, with e4m3 tensor-core products)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from minivllm.kernels.fp8_gemm_configs import FP8_MAX, GROUP_SIZE, SCALE_EPS

FP8_DTYPE = torch.float8_e4m3fn

# (x [..., K], wq [N, K] e4m3, ws [cdiv(N, 128), cdiv(K, 128)] float32, bias [N] | None)
# -> [..., N] in x.dtype
BlockFp8Gemm = Callable[..., torch.Tensor]


def _pad_to(x: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    pad = -x.shape[dim] % multiple
    if pad == 0:
        return x
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([x, x.new_zeros(shape)], dim)


def quantize_weight_blocks(
    w: torch.Tensor, block: tuple[int, int] = (128, 128)
) -> tuple[torch.Tensor, torch.Tensor]:
    """w: [N, K] -> (q [N, K] e4m3, s [cdiv(N, bn), cdiv(K, bk)] float32), w ~= q * s blockwise,
    each block's largest magnitude mapped to 448 (the checkpoints' `weight_scale_inv`)."""
    bn, bk = block
    N, K = w.shape
    wp = _pad_to(_pad_to(w.float(), 0, bn), 1, bk)
    blocks = wp.reshape(wp.shape[0] // bn, bn, wp.shape[1] // bk, bk)
    scale = blocks.abs().amax(dim=(1, 3)).clamp_min(SCALE_EPS) / FP8_MAX
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(wp.shape)[:N, :K].contiguous(), scale


def dequantize_blocks(
    q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] = (128, 128)
) -> torch.Tensor:
    """q [N, K] e4m3 and its block scales -> float32 [N, K]."""
    N, K = q.shape
    expanded = scale.repeat_interleave(block[0], 0)[:N].repeat_interleave(block[1], 1)[:, :K]
    return q.float() * expanded


def quantize_token_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] -> (q [M, K] e4m3, s [M, cdiv(K, 128)] float32), one scale per token and
    group of 128 along K (what the Triton kernel does before its GEMM)."""
    M, K = x.shape
    groups = _pad_to(x.float(), 1, GROUP_SIZE).reshape(M, -(-K // GROUP_SIZE), GROUP_SIZE)
    scale = groups.abs().amax(dim=2).clamp_min(SCALE_EPS) / FP8_MAX
    q = (groups / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(M, groups.shape[1] * GROUP_SIZE)[:, :K].contiguous(), scale


def dequantize_token_groups(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The inverse of quantize_token_groups, in float32."""
    return q.float() * scale.repeat_interleave(GROUP_SIZE, 1)[:, : q.shape[1]]


def block_fp8_linear_ref(
    x: torch.Tensor,
    wq: torch.Tensor,
    ws: torch.Tensor,
    bias: torch.Tensor | None = None,
    gemm: Callable[..., torch.Tensor] = F.linear,
) -> torch.Tensor:
    """W8A8 in float32: x quantized per token-group and dequantized, times the dequantized
    weight, by `gemm` (F.linear; deterministic mode's batch-invariant GEMM); [..., N] in
    x.dtype."""
    lead, K = x.shape[:-1], x.shape[-1]
    xq, xs = quantize_token_groups(x.reshape(-1, K))
    y = gemm(dequantize_token_groups(xq, xs), dequantize_blocks(wq, ws))
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*lead, wq.shape[0])
