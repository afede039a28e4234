"""The one rule for fused ops: Triton kernels on CUDA, torch elsewhere, chosen once when the
model and sampler are built (attention chooses its backend object the same way)."""

from __future__ import annotations

import torch


def use_triton_kernels(device: torch.device | str) -> bool:
    """Whether layers built for `device` run the Triton kernels of `minivllm.kernels`.

    The CPU engine runs the torch definitions (no triton import); tests build layers with
    use_triton=True on the CPU to run the kernels in Triton's interpreter.
    """
    return torch.device(device).type == "cuda"
