"""Qwen3.5 / 3.6 MoE (Qwen3.5-35B-A3B, Qwen3.6-35B-A3B), the text path: Qwen3.5's hybrid
decoder (qwen3_5.py) whose every MLP is a sparse MoE block with a shared expert: softmax top-k
routing, renormalized unless config.json says norm_topk_prob false, plus a dense MLP scaled by
sigmoid(shared_expert_gate(x)).

Checkpoints store each expert's projections apart (`mlp.experts.{e}.gate_proj.weight`, ...,
as transformers' save_pretrained writes them), or fused as transformers 5 holds them in memory
(`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`); either is stacked into FusedMoE at load."""

from __future__ import annotations

from minivllm.models.moe_mlp import MoeMlps
from minivllm.models.qwen3_5 import Qwen3_5ForCausalLM


class Qwen3_5MoeForCausalLM(MoeMlps, Qwen3_5ForCausalLM):
    """Qwen3.5-MoE: the dense decoder with MoE MLPs (MoeMlps)."""


class Qwen3_5MoeForConditionalGeneration(Qwen3_5MoeForCausalLM):
    """The text path of the vision-language checkpoints (the vision tower is not loaded)."""

    checkpoint_prefix_map = {"model.language_model.": "model."}
