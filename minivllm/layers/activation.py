"""SiLU-and-multiply, the gated activation of the Llama/Qwen MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """x: [num_tokens, 2 * intermediate] (gate then up) -> [num_tokens, intermediate]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from minivllm.kernels.activation import silu_and_mul

            return silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
