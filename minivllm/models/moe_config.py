"""MoeConfig: the mixture-of-experts hyperparameters of a config.json (Qwen3-MoE's and
Qwen3.5-MoE's names), which layers are sparse, and the shared expert's size where there is one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    num_experts_per_tok: int  # top_k
    moe_intermediate_size: int  # one expert's
    norm_topk_prob: bool  # renormalize the top-k probabilities to sum to 1
    decoder_sparse_step: int = 1  # layer i is sparse when (i + 1) % step == 0 ...
    mlp_only_layers: tuple[int, ...] = ()  # ... and i is not listed here (dense MLP)
    # Qwen3.5-MoE: a dense MLP beside the routed experts that every token goes through,
    # scaled by a sigmoid gate; 0: none.
    shared_expert_intermediate_size: int = 0

    def is_sparse(self, layer_idx: int) -> bool:
        """Whether layer layer_idx has experts (as transformers' Qwen3MoeDecoderLayer decides)."""
        return (
            layer_idx not in self.mlp_only_layers
            and (layer_idx + 1) % self.decoder_sparse_step == 0
        )


def moe_config_from_hf(
    hf: dict[str, Any], norm_topk_prob_default: bool = False
) -> MoeConfig | None:
    """None for a dense config (no experts); a ValueError for a bad MoE field.
    transformers 5 writes num_experts as num_local_experts. norm_topk_prob_default: the
    family's choice where config.json has no norm_topk_prob (Qwen3.5-MoE always renormalizes)."""
    num_experts = hf.get("num_experts", hf.get("num_local_experts"))
    if not num_experts:
        return None
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"MoE experts support hidden_act 'silu', got {hf['hidden_act']!r}")
    fields = {
        "num_experts": num_experts,
        "num_experts_per_tok": hf.get("num_experts_per_tok"),
        "moe_intermediate_size": hf.get("moe_intermediate_size"),
        "decoder_sparse_step": hf.get("decoder_sparse_step", 1),
    }
    shared = hf.get("shared_expert_intermediate_size", 0)
    if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
        raise ValueError(
            f"config.json: shared_expert_intermediate_size must be a non-negative integer, "
            f"got {shared!r}"
        )
    for key, value in fields.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"config.json: {key} must be a positive integer, got {value!r}")
    if fields["num_experts_per_tok"] > num_experts:
        raise ValueError(
            f"config.json: num_experts_per_tok ({fields['num_experts_per_tok']}) exceeds "
            f"num_experts ({num_experts})"
        )
    return MoeConfig(
        **fields,
        norm_topk_prob=bool(hf.get("norm_topk_prob", norm_topk_prob_default)),
        mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()),
        shared_expert_intermediate_size=shared,
    )
