"""RMSNorm with an optional fused residual add, computed in float32 like HF."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """use_triton: one Triton kernel for the add and the norm (kernels/rmsnorm.py)."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        dtype: torch.dtype | None = None,
        use_triton: bool = False,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.use_triton = use_triton
        if use_triton:
            from minivllm.kernels.rmsnorm import rms_norm

            self._rms_norm = rms_norm

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        # HF casts back before the weight multiply; doing the same keeps bf16 results identical.
        return self.weight * x32.to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x, residual: [..., hidden]. With residual: returns (norm(x + residual), x + residual)."""
        if self.use_triton:
            shape = x.shape
            rows = x.reshape(-1, shape[-1])
            res_rows = None if residual is None else residual.reshape(-1, shape[-1])
            out, new_residual = self._rms_norm(rows, self.weight, self.eps, res_rows)
            if residual is None:
                return out.view(shape)
            return out.view(shape), new_residual.view(shape)
        if residual is None:
            return self._norm(x)
        # The add happens in the model dtype, as in HF's decoder layer.
        residual = x + residual
        return self._norm(residual), residual


class ZeroCenteredRMSNorm(nn.Module):
    """RMSNorm whose weight is stored as an offset from 1 (the scale is 1 + w), with an optional
    fused residual add: Qwen3.5's norms. HF's order: normalize and scale in float32, then cast."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(hidden_size, dtype=dtype), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x, residual: [..., hidden]. With residual: returns (norm(x + residual), x + residual)."""
        if residual is None:
            return self._norm(x)
        residual = x + residual  # in the model dtype, as in HF's decoder layer
        return self._norm(residual), residual
