"""The MoE router's choice: softmax over the experts in float32, the top-k with ties broken
toward the lowest expert id, optionally renormalized (Qwen3-MoE's `norm_topk_prob`)."""

from __future__ import annotations

import torch


def route(
    router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits: [num_tokens, num_experts] -> (topk_weights [num_tokens, top_k] float32,
    topk_ids [num_tokens, top_k] int32), experts by descending probability.

    torch.topk leaves the order of equal values to the implementation; a stable descending
    sort keeps the lower id first, on every device and at every batch size."""
    if not 1 <= top_k <= router_logits.shape[-1]:
        raise ValueError(f"top_k must be in [1, {router_logits.shape[-1]}], got {top_k}")
    probs = torch.softmax(router_logits.float(), dim=-1)
    sorted_probs, sorted_ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    weights, ids = sorted_probs[:, :top_k], sorted_ids[:, :top_k]
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.contiguous(), ids.to(torch.int32).contiguous()
