"""Picks the attention backend: `auto` is triton on CUDA and torch_sdpa on the CPU."""

from __future__ import annotations

import os

import torch

from minivllm.attention.base import AttentionBackend
from minivllm.attention.torch_sdpa import TorchSDPABackend


def resolve_backend_name(name: str, device: torch.device) -> str:
    if name == "auto":
        return "triton" if device.type == "cuda" else "torch_sdpa"
    # On the CPU the triton backend runs only in Triton's interpreter (slow; used by tests).
    if name == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "attention_backend='triton' needs a CUDA device (or TRITON_INTERPRET=1); "
            "use torch_sdpa on the CPU"
        )
    return name


def get_attn_backend(
    name: str,
    device: torch.device,
    num_heads: int,
    head_dim: int,
    max_num_seqs: int,
    max_model_len: int,
    num_kv_heads: int = 1,
    deterministic: bool = False,
    prefill_kernel: str = "auto",
) -> AttentionBackend:
    """deterministic: batch-invariant attention (docs/determinism.md), triton only.
    prefill_kernel: the triton backend's prefill kernel (EngineConfig.prefill_attention_kernel)."""
    name = resolve_backend_name(name, device)
    if deterministic and name != "triton":
        raise ValueError(
            "deterministic=True needs attention_backend='triton' (CUDA, or TRITON_INTERPRET=1 "
            f"on the CPU); got {name!r}"
        )
    if prefill_kernel == "gluon" and name != "triton":
        raise ValueError(
            f"prefill_attention_kernel='gluon' needs attention_backend='triton'; got {name!r}"
        )
    if name == "torch_sdpa":
        return TorchSDPABackend()
    # Imported lazily: triton is only needed on CUDA.
    from minivllm.attention.triton import TritonBackend

    return TritonBackend(
        num_heads=num_heads,
        head_dim=head_dim,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        device=device,
        num_kv_heads=num_kv_heads,
        deterministic=deterministic,
        prefill_kernel=prefill_kernel,
    )
