"""The MLP of a mixture-of-experts family's layer, from its MoeConfig: the sparse block on
sparse layers (with the shared expert where the config has one), the dense MLP elsewhere; and
the checkpoints' per-expert names, stacked at load (model_loader_experts.py)."""

from __future__ import annotations

import torch
from torch import nn

from minivllm.layers.moe import SharedExpertMoeBlock, SparseMoeBlock
from minivllm.layers.ops import LayerOps
from minivllm.models.llama import DecoderMLP, MakeMlp
from minivllm.models.model_config import ModelConfig

# Checkpoint name part of expert e (`mlp.experts.{e}.gate_proj.weight`, ...) -> (FusedMoE
# parameter, part of shard_id (e, part)).
EXPERT_MODULES_MAPPING = {
    "gate_proj": ("gate_up_proj", "gate"),
    "up_proj": ("gate_up_proj", "up"),
    "down_proj": ("down_proj", "down"),
}


def make_moe_mlp(
    config: ModelConfig,
    layer_idx: int,
    dtype: torch.dtype | None,
    use_triton: bool,
    ops: LayerOps,
    dense: MakeMlp,
) -> nn.Module:
    """Layer layer_idx's MLP: `dense(...)` where config.moe says the layer has no experts."""
    moe = config.moe
    if moe is None or not moe.is_sparse(layer_idx):
        return dense(config, layer_idx, dtype, use_triton, ops)
    sizes = (config.hidden_size, moe.num_experts, moe.num_experts_per_tok)
    routed = (*sizes, moe.moe_intermediate_size, moe.norm_topk_prob)
    if not moe.shared_expert_intermediate_size:
        return SparseMoeBlock(*routed, dtype, use_triton, ops)
    shared = DecoderMLP(config, dtype, use_triton, ops, moe.shared_expert_intermediate_size)
    return SharedExpertMoeBlock(*routed, shared, dtype, use_triton, ops)
