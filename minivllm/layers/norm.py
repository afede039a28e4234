"""RMSNorm with an optional fused residual add, computed in float32 like HF."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(
        self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        # HF casts back before the weight multiply; doing the same keeps bf16 results identical.
        return self.weight * x32.to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x, residual: [..., hidden]. With residual: returns (norm(x + residual), x + residual)."""
        if x.is_cuda and x.dim() == 2:
            # One Triton kernel for the add and the norm (kernels/rmsnorm.py).
            from minivllm.kernels.rmsnorm import rms_norm

            out, new_residual = rms_norm(x, self.weight, self.eps, residual)
            return out if residual is None else (out, new_residual)
        if residual is None:
            return self._norm(x)
        # The add happens in the model dtype, as in HF's decoder layer.
        residual = x + residual
        return self._norm(residual), residual
