"""The router's Triton top-k (interpreter) against the torch definition (layers/moe_router.py):
the same experts in the same order, ties to the lowest id, the same weights; 128 experts
top-8 as Qwen3-30B-A3B has them, and sizes that are not powers of two."""

from __future__ import annotations

import pytest
import torch

from minivllm.kernels.moe.router import topk_softmax
from minivllm.layers.moe_router import route


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize(
    ("num_experts", "top_k", "dtype"),
    [(128, 8, torch.float32), (8, 2, torch.float16), (60, 6, torch.float32), (5, 1, torch.float32)],
)
def test_matches_torch(num_experts: int, top_k: int, dtype: torch.dtype, renormalize: bool) -> None:
    g = torch.Generator().manual_seed(num_experts)
    logits = (torch.randn(37, num_experts, generator=g) * 3).to(dtype)
    weights, ids = topk_softmax(logits, top_k, renormalize)
    ref_weights, ref_ids = route(logits, top_k, renormalize)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, atol=1e-6, rtol=1e-5)


def test_ties_go_to_the_lowest_expert_id() -> None:
    logits = torch.zeros(3, 16)
    logits[1, [3, 9, 12]] = 1.0
    logits[2, 5] = 2.0
    weights, ids = topk_softmax(logits, 2, True)
    assert ids.tolist() == [[0, 1], [3, 9], [5, 0]]
    assert torch.equal(ids, route(logits, 2, True)[1])
    torch.testing.assert_close(weights[0], torch.tensor([0.5, 0.5]))


def test_no_tokens_and_bad_top_k() -> None:
    weights, ids = topk_softmax(torch.zeros(0, 8), 2, True)
    assert weights.shape == ids.shape == (0, 2)
    with pytest.raises(ValueError, match="top_k"):
        topk_softmax(torch.zeros(3, 8), 9, True)
