"""Qwen3.5 / 3.6 MoE (Qwen3.5-35B-A3B, Qwen3.6-35B-A3B), the text path: Qwen3.5's hybrid
decoder (qwen3_5.py) whose every MLP is a sparse MoE block with a shared expert: softmax top-k
routing, renormalized unless config.json says norm_topk_prob false, plus a dense MLP scaled by
sigmoid(shared_expert_gate(x)).

Checkpoints store each expert's projections apart (`mlp.experts.{e}.gate_proj.weight`, ...,
as transformers' save_pretrained writes them), or fused as transformers 5 holds them in memory
(`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`); either is stacked into FusedMoE at load."""

from __future__ import annotations

import torch
from torch import nn

from minivllm.layers.ops import LayerOps
from minivllm.models.model_config import ModelConfig
from minivllm.models.moe_mlp import EXPERT_MODULES_MAPPING, make_moe_mlp, split_fused_experts
from minivllm.models.qwen3_5 import Qwen3_5ForCausalLM


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
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


class Qwen3_5MoeForConditionalGeneration(Qwen3_5MoeForCausalLM):
    """The text path of the vision-language checkpoints (the vision tower is not loaded)."""

    checkpoint_prefix_map = {"model.language_model.": "model."}
