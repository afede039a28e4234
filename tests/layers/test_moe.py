"""The MoE layers against transformers' Qwen3-MoE modules (float32): the router (softmax,
top-k, norm_topk_prob) and its tie-break, the torch experts, the whole sparse block on the
torch and the Triton path (interpreter), and FusedMoE's tensor-parallel shards."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe import modeling_qwen3_moe as hf_moe

from minivllm.layers import fused_moe as fused_moe_module
from minivllm.layers.fused_moe import FusedMoE
from minivllm.layers.moe import SparseMoeBlock
from minivllm.layers.moe_experts import experts_torch
from minivllm.layers.moe_router import route
from minivllm.layers.ops import LayerOps

E, H, INTER, TOP_K = 8, 64, 32, 2


def hf_config(norm_topk_prob: bool = True) -> Qwen3MoeConfig:
    return Qwen3MoeConfig(
        hidden_size=H, moe_intermediate_size=INTER, num_experts=E, num_experts_per_tok=TOP_K,
        norm_topk_prob=norm_topk_prob, initializer_range=0.1,
    )  # fmt: skip


def hf_block(norm_topk_prob: bool, seed: int = 0) -> hf_moe.Qwen3MoeSparseMoeBlock:
    torch.manual_seed(seed)
    block = hf_moe.Qwen3MoeSparseMoeBlock(hf_config(norm_topk_prob))
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.1)
    return block.eval()


def load_like_checkpoint(experts: FusedMoE, hf_experts) -> None:
    """Feeds FusedMoE each expert's gate, up and down as a checkpoint stores them."""
    for e in range(E):
        gate, up = hf_experts.gate_up_proj[e].detach().chunk(2, dim=0)
        down = hf_experts.down_proj[e].detach()
        experts.gate_up_proj.weight_loader(experts.gate_up_proj, gate, (e, "gate"))
        experts.gate_up_proj.weight_loader(experts.gate_up_proj, up, (e, "up"))
        experts.down_proj.weight_loader(experts.down_proj, down, (e, "down"))


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_route_matches_hf_router(norm_topk_prob: bool) -> None:
    router = hf_block(norm_topk_prob).gate
    x = torch.randn(33, H)
    logits, hf_weights, hf_ids = router(x)
    weights, ids = route(logits, TOP_K, norm_topk_prob)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.equal(ids.long(), hf_ids)
    torch.testing.assert_close(weights, hf_weights, atol=1e-7, rtol=1e-6)


def test_route_breaks_ties_toward_the_lowest_expert_id() -> None:
    logits = torch.zeros(3, 16)
    logits[1, [3, 9, 12]] = 1.0  # three equal maxima: 3 and 9 win
    logits[2, 5] = 2.0  # then 15 experts tied at 0: the lowest ids after 5 are 0
    weights, ids = route(logits, 2, norm_topk_prob=True)
    assert ids.tolist() == [[0, 1], [3, 9], [5, 0]]
    torch.testing.assert_close(weights[0], torch.tensor([0.5, 0.5]))


def test_experts_torch_matches_hf_experts() -> None:
    block = hf_block(True)
    x = torch.randn(21, H)
    _, topk_weights, topk_ids = block.gate(x)
    with torch.no_grad():
        expected = block.experts(x, topk_ids, topk_weights)
    w13, w2 = block.experts.gate_up_proj.detach(), block.experts.down_proj.detach()
    got = experts_torch(x, w13, w2, topk_weights, topk_ids.to(torch.int32))
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("use_triton", [False, True])
@pytest.mark.parametrize("num_tokens", [1, 19])
def test_sparse_block_matches_hf(use_triton: bool, num_tokens: int) -> None:
    hf = hf_block(True, seed=num_tokens)
    ours = SparseMoeBlock(H, E, TOP_K, INTER, True, torch.float32, use_triton)
    ours.gate.weight.weight_loader(ours.gate.weight, hf.gate.weight.detach())
    load_like_checkpoint(ours.experts, hf.experts)
    x = torch.randn(num_tokens, H)
    with torch.no_grad():
        expected = hf(x[None])[0]
        got = ours(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_tp_shards_sum_to_the_full_experts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank holds a slice of every expert's intermediate dim; the ranks' partial outputs
    (here summed by the test: the all-reduce's job) equal the whole experts."""
    hf = hf_block(True)
    x = torch.randn(11, H)
    _, topk_weights, topk_ids = hf.gate(x)
    with torch.no_grad():
        expected = hf.experts(x, topk_ids, topk_weights)
    tp_size, total = 2, torch.zeros_like(expected)
    no_reduce = LayerOps(row_reduce=lambda t, n: t)
    for rank in range(tp_size):
        monkeypatch.setattr(fused_moe_module, "get_tp_rank_size", lambda r=rank: (r, tp_size))
        experts = FusedMoE(E, H, INTER, torch.float32, ops=no_reduce)
        assert experts.gate_up_proj.shape == (E, INTER, H)  # half the gate, half the up rows
        assert experts.down_proj.shape == (E, H, INTER // 2)
        load_like_checkpoint(experts, hf.experts)
        with torch.no_grad():
            total += experts(x, topk_weights, topk_ids.to(torch.int32))
    torch.testing.assert_close(total, expected, atol=1e-6, rtol=1e-5)


def test_weight_loader_rejects_bad_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    experts = FusedMoE(E, H, INTER, torch.float32)
    param = experts.gate_up_proj
    with pytest.raises(ValueError, match="shard_id"):
        param.weight_loader(param, torch.zeros(INTER, H), (E, "gate"))
    with pytest.raises(ValueError, match="shard_id"):
        param.weight_loader(param, torch.zeros(INTER, H), 0)
    with pytest.raises(ValueError, match="shape mismatch"):
        param.weight_loader(param, torch.zeros(INTER + 1, H), (0, "up"))
    monkeypatch.setattr(fused_moe_module, "get_tp_rank_size", lambda: (0, 3))
    with pytest.raises(ValueError, match=r"moe_intermediate_size \(32\).*\(3\)"):
        FusedMoE(E, H, INTER, torch.float32)
