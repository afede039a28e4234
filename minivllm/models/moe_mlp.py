"""The MLP of a mixture-of-experts family's layer, from its MoeConfig: the sparse block on
sparse layers (with the shared expert where the config has one), the dense MLP elsewhere; and
the checkpoints' per-expert names, stacked at load (model_loader_experts.py), to which
transformers 5's fused expert tensors are split first (`split_fused_experts`). A family takes
all of it as one mixin, `MoeMlps`, before its dense base class."""

from __future__ import annotations

import re

import torch
from torch import nn

from minivllm.layers.moe import SharedExpertMoeBlock, SparseMoeBlock, partial_sum_ops
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
_FUSED_EXPERTS = re.compile(r"(?P<prefix>.+\.experts)\.(?P<param>gate_up_proj|down_proj)")


def split_fused_experts(name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """A layer's experts as transformers 5 holds them in memory (a checkpoint may store them so):
    `<prefix>.experts.gate_up_proj` [E, 2I, H] (each expert's gate rows, then its up rows) and
    `<prefix>.experts.down_proj` [E, H, I] -> (per-expert name, tensor) of each expert's
    projections; any other tensor as it is."""
    match = _FUSED_EXPERTS.fullmatch(name)
    if match is None or tensor.dim() != 3:
        return [(name, tensor)]
    prefix = match["prefix"]
    if match["param"] == "down_proj":
        return [(f"{prefix}.{e}.down_proj.weight", w) for e, w in enumerate(tensor.unbind(0))]
    if tensor.shape[1] % 2:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}: an odd gate + up row count")
    gates, ups = tensor.chunk(2, dim=1)
    return [
        (f"{prefix}.{e}.{part}.weight", w[e])
        for e in range(tensor.shape[0])
        for part, w in (("gate_proj", gates), ("up_proj", ups))
    ]


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
    # Its partial sums and the routed experts' meet in the block's one all-reduce.
    shared_ops = partial_sum_ops(ops)
    shared = DecoderMLP(config, dtype, use_triton, shared_ops, moe.shared_expert_intermediate_size)
    return SharedExpertMoeBlock(*routed, shared, dtype, use_triton, ops)


class MoeMlps:
    """Mixin of a MoE family (`class Qwen3MoeForCausalLM(MoeMlps, Qwen3ForCausalLM)`): its
    layers' MLPs by make_moe_mlp, the dense base's make_mlp where a layer has no experts."""

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
        dense = super().make_mlp  # the dense base class that follows this mixin
        return make_moe_mlp(config, layer_idx, dtype, use_triton, ops, dense)
