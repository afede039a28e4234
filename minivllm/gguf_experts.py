"""GGUF mixture-of-experts files (llama.cpp's `qwen3moe`, `qwen35moe`, `qwen3next`): their
expert metadata as the HF config's MoE fields, and their stacked expert tensors
(`blk.N.ffn_gate_exps`, `ffn_up_exps` [E, I, H], `ffn_down_exps` [E, H, I]) as HF's per-expert
names, which the loader stacks into FusedMoE as it does a safetensors checkpoint's
(model_loader_experts.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# GGUF architecture -> norm_topk_prob where the file does not say (`expert_weights_norm`):
# llama.cpp's graphs of these always renormalize the top-k probabilities.
MOE_ARCHITECTURES = {"qwen3moe": True, "qwen35moe": True, "qwen3next": True}
# llama.cpp's expert-stack name -> HF's name of one expert's projection.
_EXPERT_STACKS = {
    "ffn_gate_exps": "gate_proj",
    "ffn_up_exps": "up_proj",
    "ffn_down_exps": "down_proj",
}
# convert_hf_to_gguf.py --fuse-gate-up-exps: gate and up stacked in one tensor.
_FUSED_GATE_UP = "ffn_gate_up_exps"
_SOFTMAX_GATING = 1  # gguf.ExpertGatingFuncType.SOFTMAX


def gguf_moe_fields(
    field: Callable[[str, Any], Any], arch: str, dense_layers: list[int]
) -> dict[str, Any]:
    """The HF config's MoE fields of a `MOE_ARCHITECTURES` file; field(key, default) reads
    `{arch}.<key>` metadata; dense_layers: the layers without a router tensor (a dense MLP).
    A routing this engine does not run (sigmoid gating, scaled expert weights) is a
    ValueError naming the key."""
    gating = field("expert_gating_func", _SOFTMAX_GATING)
    if int(gating) != _SOFTMAX_GATING:
        raise ValueError(
            f"the GGUF's {arch}.expert_gating_func is {gating} (softmax, 1, is supported)"
        )
    scale = float(field("expert_weights_scale", 1.0))
    if scale not in (0.0, 1.0):  # llama.cpp's 0 means unscaled
        raise ValueError(f"the GGUF's {arch}.expert_weights_scale {scale} is not supported")
    sizes = {
        "num_experts": "expert_count",
        "num_experts_per_tok": "expert_used_count",
        "moe_intermediate_size": "expert_feed_forward_length",
    }
    fields: dict[str, Any] = {}
    for name, key in sizes.items():
        value = field(key, None)
        if value is None:
            raise ValueError(f"the GGUF file has no {arch + '.' + key!r} metadata")
        fields[name] = int(value)
    norm = field("expert_weights_norm", MOE_ARCHITECTURES[arch])
    return {
        **fields,
        "norm_topk_prob": bool(norm),
        "decoder_sparse_step": 1,
        "mlp_only_layers": dense_layers,
        "shared_expert_intermediate_size": int(field("expert_shared_feed_forward_length", 0)),
    }


def split_expert_stack(name: str, weight: torch.Tensor) -> list[tuple[str, torch.Tensor]] | None:
    """A layer's expert stack (`blk.N.ffn_up_exps.weight`, [E, ...]) -> (HF name, expert e's
    tensor) for each expert (`model.layers.N.mlp.experts.e.up_proj.weight`); the converter's
    fused `ffn_gate_up_exps` [E, 2 I, H] (gate rows, then up rows) gives both projections; None
    for any other tensor."""
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "blk":
        return None
    if parts[2] not in (*_EXPERT_STACKS, _FUSED_GATE_UP):
        return None
    if weight.dim() != 3:
        raise ValueError(f"GGUF tensor {name} has shape {tuple(weight.shape)}; expected 3 dims")
    prefix = f"model.layers.{parts[1]}.mlp.experts"
    stacks = {_EXPERT_STACKS[parts[2]]: weight} if parts[2] in _EXPERT_STACKS else {}
    if parts[2] == _FUSED_GATE_UP:
        stacks = dict(zip(("gate_proj", "up_proj"), weight.chunk(2, dim=1), strict=True))
    return [
        (f"{prefix}.{e}.{part}.{parts[3]}", w)
        for part, stack in stacks.items()
        for e, w in enumerate(stack.unbind(0))
    ]
