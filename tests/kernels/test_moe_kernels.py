"""The fused-MoE kernels in Triton's interpreter against the torch definition
(layers/moe_experts.py): alignment by expert, the whole layer (float32, float16) over routes
with idle experts, every token on the same experts, one token, several row blocks an expert;
the per-token sum's order. Rows alone vs batched, bit for bit: test_moe_batch_invariance.py."""

from __future__ import annotations

import pytest
import torch

from minivllm.kernels.moe.align import align_by_expert, max_padded_rows
from minivllm.kernels.moe.configs import GemmTile, MoeTileConfig
from minivllm.kernels.moe.fused_moe import fused_moe
from minivllm.kernels.moe.topk_sum import topk_sum
from minivllm.layers.moe_experts import experts_torch
from minivllm.layers.moe_router import route

E, H, INTER, TOP_K = 8, 64, 32, 2


def routes(kind: str, num_tokens: int, num_experts: int, top_k: int) -> torch.Tensor:
    """topk_ids [num_tokens, top_k] int32 of a kind of step."""
    g = torch.Generator().manual_seed(num_tokens)
    if kind == "random":
        scores = torch.rand(num_tokens, num_experts, generator=g)
        return scores.topk(top_k, dim=-1).indices.to(torch.int32)
    if kind == "same":  # every token on experts 5, 2, ...: the others get nothing
        ids = torch.tensor([5, 2, 7, 0][:top_k], dtype=torch.int32)
        return ids.repeat(num_tokens, 1)
    if kind == "skewed":  # experts 0 and 1 idle, expert 3 in every token
        others = torch.stack([torch.randperm(num_experts - 4, generator=g)[: top_k - 1] + 4
                              for _ in range(num_tokens)])  # fmt: skip
        first = torch.full((num_tokens, 1), 3)
        return torch.cat([first, others], dim=1).to(torch.int32)
    raise ValueError(kind)


def weights(num_experts: int, hidden: int, inter: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(7)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=g) * hidden**-0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=g) * inter**-0.5
    return w13.to(dtype), w2.to(dtype)


def inputs(num_tokens: int, kind: str, dtype: torch.dtype, top_k: int = TOP_K):
    g = torch.Generator().manual_seed(100 + num_tokens)
    x = torch.randn(num_tokens, H, generator=g).to(dtype)
    ids = routes(kind, num_tokens, E, top_k)
    topk_weights = torch.rand(num_tokens, top_k, generator=g)
    return x, topk_weights / topk_weights.sum(-1, keepdim=True), ids


@pytest.mark.parametrize("kind", ["random", "same", "skewed"])
@pytest.mark.parametrize("num_tokens", [1, 5, 40, 700])  # 700 * 2 pairs: two chunks
def test_align_groups_every_pair_once(kind: str, num_tokens: int) -> None:
    ids = routes(kind, num_tokens, E, TOP_K)
    block_m = 16
    blocks = align_by_expert(ids, E, block_m)
    num_pairs = num_tokens * TOP_K
    assert blocks.pair_ids.shape == (max_padded_rows(num_pairs, E, block_m),)
    num_padded = int(blocks.num_padded)
    flat = ids.reshape(-1).tolist()
    counts = [flat.count(e) for e in range(E)]
    assert num_padded == sum(-(-c // block_m) * block_m for c in counts)
    rows = blocks.pair_ids.tolist()[:num_padded]  # past num_padded: never read, garbage
    assert sorted(p for p in rows if p < num_pairs) == list(range(num_pairs))
    assert all(p == num_pairs for p in rows if p >= num_pairs)
    experts = blocks.block_experts.tolist()
    for b in range(num_padded // block_m):
        block = [p for p in rows[b * block_m : (b + 1) * block_m] if p < num_pairs]
        assert block and all(flat[p] == experts[b] for p in block)
        assert block == sorted(block)
    assert experts[: num_padded // block_m] == sorted(experts[: num_padded // block_m])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("num_tokens", "kind"),
    [(1, "random"), (5, "same"), (40, "same"), (40, "random"), (40, "skewed")],
)
def test_fused_moe_matches_torch(dtype: torch.dtype, num_tokens: int, kind: str) -> None:
    x, topk_weights, ids = inputs(num_tokens, kind, dtype)
    w13, w2 = weights(E, H, INTER, dtype)
    out = fused_moe(x, w13, w2, topk_weights, ids)
    assert out.shape == (num_tokens, H) and out.dtype == dtype
    ref = experts_torch(x.float(), w13.float(), w2.float(), topk_weights, ids)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("block_m", [16, 32, 64])
def test_fused_moe_block_sizes_and_ragged_tiles(block_m: int) -> None:
    """Experts spanning several row blocks, N and K not multiples of the tiles (hidden 48,
    intermediate 40), top-3 of 6 experts."""
    num_experts, hidden, inter, top_k, num_tokens = 6, 48, 40, 3, 37
    g = torch.Generator().manual_seed(3)
    x = torch.randn(num_tokens, hidden, generator=g)
    w13, w2 = weights(num_experts, hidden, inter, torch.float32)
    topk_weights, ids = route(torch.randn(num_tokens, num_experts, generator=g), top_k, False)
    tile = GemmTile(32, 32, 4, 2)
    out = fused_moe(x, w13, w2, topk_weights, ids, MoeTileConfig(block_m, tile, tile))
    ref = experts_torch(x, w13, w2, topk_weights, ids)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_no_tokens() -> None:
    x, topk_weights, ids = inputs(0, "random", torch.float32)
    w13, w2 = weights(E, H, INTER, torch.float32)
    assert fused_moe(x, w13, w2, topk_weights, ids).shape == (0, H)


def test_topk_sum_adds_in_order() -> None:
    """float32 sums in k order: the k = 0 row's 1.0 is lost under 2^24 added first, kept if
    added after; the kernel must give the in-order result."""
    y = torch.tensor([[1.0, 0.0], [2.0**24, 1.0], [-(2.0**24), 0.0]])
    out = topk_sum(y, 3)
    assert out.tolist() == [[0.0, 1.0]]  # (1 + 2^24) - 2^24 = 0 in float32
    y = torch.randn(12, 40, dtype=torch.float16)
    expected = y.view(4, 3, 40).float()
    torch.testing.assert_close(
        topk_sum(y, 3).float(), (expected[:, 0] + expected[:, 1] + expected[:, 2]).half().float()
    )
