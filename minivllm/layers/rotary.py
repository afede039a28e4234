"""Rotary position embedding (neox style, rotate_half) with a precomputed cos/sin cache.

Supports rope_type "default" and "llama3"; the inverse frequencies follow HF's formulas.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from minivllm.layers.norm import RMSNorm

if TYPE_CHECKING:
    from minivllm.kernels.kv_store import KVWrite

SUPPORTED_ROPE_TYPES = ("default", "llama3")


def default_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies base^(-2i / head_dim)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return 1.0 / (base**exponents)


def llama3_inv_freq(head_dim: int, base: float, rope_scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths divided by `factor`, short ones kept, a smooth
    blend in between (the band set by low/high_freq_factor over the original context)."""
    try:
        factor = float(rope_scaling["factor"])
        low_freq_factor = float(rope_scaling["low_freq_factor"])
        high_freq_factor = float(rope_scaling["high_freq_factor"])
        old_context_len = rope_scaling["original_max_position_embeddings"]
    except KeyError as e:
        raise ValueError(f"llama3 rope_scaling is missing {e.args[0]!r}: {rope_scaling}") from e
    inv_freq = default_inv_freq(head_dim, base)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def compute_inv_freq(
    head_dim: int, base: float, rope_scaling: dict[str, Any] | None
) -> torch.Tensor:
    rope_type = "default"
    if rope_scaling is not None:
        rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rope_type == "default":
        return default_inv_freq(head_dim, base)
    if rope_type == "llama3":
        return llama3_inv_freq(head_dim, base, rope_scaling)
    raise ValueError(
        f"rope_type {rope_type!r} is not supported; supported rope types: {SUPPORTED_ROPE_TYPES}"
    )


class RotaryEmbedding(nn.Module):
    """use_triton: one Triton kernel rotates q and k in place (kernels/rope.py), with the
    per-head q/k RMSNorm of Qwen3 fused in front when norms are given."""

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        base: float,
        rope_scaling: dict[str, Any] | None = None,
        dtype: torch.dtype | None = None,
        use_triton: bool = False,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        inv_freq = compute_inv_freq(head_dim, base, rope_scaling)
        freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        # cos_sin_cache: [max_position, head_dim], cos in the first half, sin in the second;
        # stored in the model dtype because HF casts cos/sin to it before the rotation.
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype or torch.float32)
        self.register_buffer("cos_sin_cache", cache, persistent=False)
        self.use_triton = use_triton
        if use_triton:
            from minivllm.kernels.rope import rotary_embedding

            self._rotary_embedding = rotary_embedding

    def forward(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
        kv_write: KVWrite | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [num_tokens]; q: [num_tokens, num_heads * head_dim]; k likewise with
        num_kv_heads. With q_norm and k_norm each head is RMS-normalized first (Qwen3).
        Returns the rotated (q, k) in the same shapes (the Triton path rotates in place).
        kv_write (Triton path only): the same kernel writes the rotated k and kv_write.v
        into the paged KV cache (Attention.kv_write)."""
        num_tokens = q.shape[0]
        q_heads = q.view(num_tokens, -1, self.head_dim)
        k_heads = k.view(num_tokens, -1, self.head_dim)
        if self.use_triton:
            self._rotary_embedding(
                positions,
                q_heads,
                k_heads,
                self.cos_sin_cache,
                None if q_norm is None else q_norm.weight,
                None if k_norm is None else k_norm.weight,
                1e-6 if q_norm is None else q_norm.eps,
                kv_write,
            )
            return q, k
        if kv_write is not None:
            raise ValueError("kv_write needs the Triton RoPE kernel (use_triton=True)")
        if q_norm is not None and k_norm is not None:
            q_heads, k_heads = q_norm(q_heads), k_norm(k_heads)
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)
        # cos, sin: [num_tokens, 1, head_dim // 2], broadcast over heads
        cos, sin = cos[:, None, :], sin[:, None, :]
        q_out = _rotate(q_heads, cos, sin).view(q.shape)
        return q_out, _rotate(k_heads, cos, sin).view(k.shape)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, num_heads, head_dim] -> rotated, same shape."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class PartialRotaryEmbedding(nn.Module):
    """RoPE (neox style) over the first rotary_dim dims of each head, the rest passed through
    (Qwen3.5: a quarter of head_dim). Torch only; cos/sin in the model dtype, as in HF."""

    def __init__(
        self,
        head_dim: int,
        rotary_dim: int,
        max_position: int,
        base: float,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
            raise ValueError(f"rotary_dim must be even and in (0, {head_dim}], got {rotary_dim}")
        self.head_dim, self.rotary_dim = head_dim, rotary_dim
        inv_freq = default_inv_freq(rotary_dim, base)
        freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype or torch.float32)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [num_tokens]; q: [num_tokens, num_heads, head_dim], k likewise with
        num_kv_heads. Returns the rotated (q, k), new tensors of the same shapes."""
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)
        cos, sin = cos[:, None, :], sin[:, None, :]  # [num_tokens, 1, rotary_dim // 2]
        d = self.rotary_dim
        q = torch.cat((_rotate(q[..., :d], cos, sin), q[..., d:]), dim=-1)
        return q, torch.cat((_rotate(k[..., :d], cos, sin), k[..., d:]), dim=-1)
