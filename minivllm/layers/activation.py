"""SiLU-and-multiply, the gated activation of the Llama/Qwen MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """x: [num_tokens, 2 * intermediate] (gate then up) -> [num_tokens, intermediate].
    use_triton: one Triton kernel (kernels/activation.py)."""

    def __init__(self, use_triton: bool = False) -> None:
        super().__init__()
        self.use_triton = use_triton
        if use_triton:
            from minivllm.kernels.activation import silu_and_mul

            self._silu_and_mul = silu_and_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_triton:
            return self._silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
