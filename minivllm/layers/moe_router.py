"""The MoE router's choice: softmax over the experts in float32, the top-k with ties broken
toward the lowest expert id, optionally renormalized (Qwen3-MoE's `norm_topk_prob`). The torch
definition here is the CPU path; on CUDA one Triton launch (`kernels/moe/router.py`)."""

from __future__ import annotations

import torch


def route(
    router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits: [num_tokens, num_experts] -> (topk_weights [num_tokens, top_k] float32,
    topk_ids [num_tokens, top_k] int32), experts by descending logit.

    The experts are picked on the float32 logits (softmax keeps their order; rounding could
    merge two probabilities). torch.topk leaves the order of equal values to the
    implementation; a stable descending sort keeps the lower id first, on every device and at
    every batch size."""
    if not 1 <= top_k <= router_logits.shape[-1]:
        raise ValueError(f"top_k must be in [1, {router_logits.shape[-1]}], got {top_k}")
    logits = router_logits.float()
    ids = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = torch.softmax(logits, dim=-1).gather(1, ids)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)
