"""Qwen3-Next (Qwen3-Next-80B-A3B), Qwen3.5's predecessor: the same hybrid decoder with MoE
MLPs and a shared expert (qwen3_5_moe.py), a dense MLP on the layers config.json says
(`mlp_only_layers`, `decoder_sparse_step`), and the Gated DeltaNet in-projections fused per key
head in its checkpoints (`in_proj_qkvz`, `in_proj_ba`), split into Qwen3.5's four at load
(layers/gated_delta_weights.py), a block-FP8 checkpoint's scales with them."""

from __future__ import annotations

import torch

from minivllm.layers.gated_delta_weights import split_in_proj
from minivllm.models.moe_mlp import split_fused_experts
from minivllm.models.qwen3_5_moe import Qwen3_5MoeForCausalLM


class Qwen3NextForCausalLM(Qwen3_5MoeForCausalLM):
    def split_checkpoint_tensor(
        self, name: str, tensor: torch.Tensor
    ) -> list[tuple[str, torch.Tensor]]:
        """A fused in-projection's weight (or block scales) -> our projections' (name, tensor);
        fused experts as Qwen3.5-MoE splits them; else as is."""
        linear = self.config.linear_attention
        heads = (linear.num_k_heads, linear.num_v_heads, linear.head_k_dim, linear.head_v_dim)
        return split_in_proj(name, tensor, *heads) or split_fused_experts(name, tensor)
