"""The router's top-k in one launch: softmax over a token's expert logits in float32, the k
largest (ties to the lowest expert id), optionally renormalized. Torch definition:
`layers/moe_router.py` (`route`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_tensor


@triton.jit
def _topk_softmax_kernel(
    logits_ptr, weights_ptr, ids_ptr, stride_l,
    NUM_EXPERTS: tl.constexpr, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr, RENORMALIZE: tl.constexpr,
):  # fmt: skip
    """Grid (num_tokens,): one token. The experts are picked on the float32 logits (softmax
    keeps their order, and rounding cannot merge two of them), k times the largest, the
    lowest id among equals; the weights are their softmax probabilities."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    x = tl.load(logits_ptr + row * stride_l + offs, mask=offs < NUM_EXPERTS, other=-float("inf"))
    x = x.to(tl.float32)
    p = tl.exp(x - tl.max(x, 0))
    p = p / tl.sum(p, 0)
    slots = tl.arange(0, BLOCK_K)
    weights = tl.zeros([BLOCK_K], tl.float32)
    ids = tl.zeros([BLOCK_K], tl.int32)
    for k in tl.static_range(TOP_K):
        best = tl.min(tl.where(x == tl.max(x, 0), offs, BLOCK_E), 0)
        weights = tl.where(slots == k, tl.sum(tl.where(offs == best, p, 0.0), 0), weights)
        ids = tl.where(slots == k, best, ids)
        x = tl.where(offs == best, -float("inf"), x)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, 0)
    tl.store(weights_ptr + row * TOP_K + slots, weights, mask=slots < TOP_K)
    tl.store(ids_ptr + row * TOP_K + slots, ids, mask=slots < TOP_K)


def topk_softmax(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits: [num_tokens, num_experts] -> (topk_weights [num_tokens, top_k] float32,
    topk_ids [num_tokens, top_k] int32), experts by descending logit."""
    check_tensor("router_logits", router_logits, 2)
    num_tokens, num_experts = router_logits.shape
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, {num_experts}], got {top_k}")
    device = router_logits.device
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=device)
    if num_tokens:
        _topk_softmax_kernel[(num_tokens,)](
            router_logits, weights, ids, router_logits.stride(0),
            NUM_EXPERTS=num_experts, TOP_K=top_k, BLOCK_E=triton.next_power_of_2(num_experts),
            BLOCK_K=triton.next_power_of_2(top_k), RENORMALIZE=renormalize, num_warps=1,
        )  # fmt: skip
    return weights, ids
