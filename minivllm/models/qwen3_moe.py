"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's decoder with a sparse MoE block as the
MLP of its sparse layers (`MoeConfig.is_sparse`), a dense MLP on the others.

Checkpoints store each expert's projections apart (`mlp.experts.{e}.gate_proj.weight`, ...);
`expert_modules_mapping` stacks them into FusedMoE's [E, 2I, H] and [E, H, I] at load."""

from __future__ import annotations

from minivllm.models.moe_mlp import MoeMlps
from minivllm.models.qwen3 import Qwen3ForCausalLM


class Qwen3MoeForCausalLM(MoeMlps, Qwen3ForCausalLM):
    """Qwen3-MoE: the dense decoder with MoE MLPs (MoeMlps)."""
