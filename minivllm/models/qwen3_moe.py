"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's decoder with a sparse MoE block as the
MLP of its sparse layers (`MoeConfig.is_sparse`), a dense MLP on the others.

Checkpoints store each expert's projections apart (`mlp.experts.{e}.gate_proj.weight`, ...);
`expert_modules_mapping` stacks them into FusedMoE's [E, 2I, H] and [E, H, I] at load."""

from __future__ import annotations

import torch
from torch import nn

from minivllm.layers.moe import SparseMoeBlock
from minivllm.layers.ops import LayerOps
from minivllm.models.model_config import ModelConfig
from minivllm.models.qwen3 import Qwen3ForCausalLM


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    # Checkpoint name part of expert e -> (FusedMoE parameter, part of shard_id (e, part)).
    expert_modules_mapping = {
        "gate_proj": ("gate_up_proj", "gate"),
        "up_proj": ("gate_up_proj", "up"),
        "down_proj": ("down_proj", "down"),
    }

    @classmethod
    def make_mlp(
        cls,
        config: ModelConfig,
        layer_idx: int,
        dtype: torch.dtype | None,
        use_triton: bool,
        ops: LayerOps,
    ) -> nn.Module:
        moe = config.moe
        if moe is None or not moe.is_sparse(layer_idx):
            return super().make_mlp(config, layer_idx, dtype, use_triton, ops)
        return SparseMoeBlock(
            config.hidden_size,
            moe.num_experts,
            moe.num_experts_per_tok,
            moe.moe_intermediate_size,
            moe.norm_topk_prob,
            dtype,
            use_triton,
            ops,
        )
