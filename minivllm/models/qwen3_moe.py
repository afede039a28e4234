"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's decoder with a sparse MoE block as the
MLP of its sparse layers (`MoeConfig.is_sparse`), a dense MLP on the others.

Checkpoints store each expert's projections apart (`mlp.experts.{e}.gate_proj.weight`, ...);
`expert_modules_mapping` stacks them into FusedMoE's [E, 2I, H] and [E, H, I] at load."""

from __future__ import annotations

import torch
from torch import nn

from minivllm.layers.ops import LayerOps
from minivllm.models.model_config import ModelConfig
from minivllm.models.moe_mlp import EXPERT_MODULES_MAPPING, make_moe_mlp, split_fused_experts
from minivllm.models.qwen3 import Qwen3ForCausalLM


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    expert_modules_mapping = EXPERT_MODULES_MAPPING
    # The loader's hook: a checkpoint's fused expert tensors as per-expert ones.
    split_checkpoint_tensor = staticmethod(split_fused_experts)

    @classmethod
    def make_mlp(
        cls,
        config: ModelConfig,
        layer_idx: int,
        dtype: torch.dtype | None,
        use_triton: bool,
        ops: LayerOps,
    ) -> nn.Module:
        dense = super().make_mlp
        return make_moe_mlp(config, layer_idx, dtype, use_triton, ops, dense)
