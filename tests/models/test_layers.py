"""Layers against HF transformers' own functions and torch references; TP slicing is checked
by simulating each rank (the collectives are replaced by sums over the simulated ranks)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from minivllm.layers import embedding as embedding_module
from minivllm.layers import linear as linear_module
from minivllm.layers.activation import SiluAndMul
from minivllm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from minivllm.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from minivllm.layers.norm import RMSNorm
from minivllm.layers.ops import LayerOps
from minivllm.layers.rotary import RotaryEmbedding, compute_inv_freq

LLAMA3_SCALING = dict(
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=64,
)


def hf_rope_config(head_dim: int, theta: float, rope_scaling: dict | None) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": theta, **(rope_scaling or {})},
    )


@pytest.mark.parametrize("rope_scaling", [None, LLAMA3_SCALING], ids=["default", "llama3"])
def test_rotary_matches_hf(rope_scaling: dict | None) -> None:
    head_dim, theta, num_tokens = 32, 10000.0, 37
    hf_config = hf_rope_config(head_dim, theta, rope_scaling)
    rope = RotaryEmbedding(head_dim, 512, theta, rope_scaling)
    positions = torch.randint(0, 512, (num_tokens,), generator=torch.Generator().manual_seed(0))
    q = torch.randn(num_tokens, 4 * head_dim)
    k = torch.randn(num_tokens, 2 * head_dim)
    out_q, out_k = rope(positions, q, k)

    hf_rope = LlamaRotaryEmbedding(hf_config)
    cos, sin = hf_rope(q, positions[None])
    # HF layout: [batch, heads, seq, head_dim]
    hf_q = q.view(1, num_tokens, 4, head_dim).transpose(1, 2)
    hf_k = k.view(1, num_tokens, 2, head_dim).transpose(1, 2)
    exp_q, exp_k = apply_rotary_pos_emb(hf_q, hf_k, cos, sin)
    torch.testing.assert_close(out_q, exp_q.transpose(1, 2).reshape(num_tokens, -1))
    torch.testing.assert_close(out_k, exp_k.transpose(1, 2).reshape(num_tokens, -1))


def test_llama3_inv_freq_matches_hf_and_scales_all_bands() -> None:
    head_dim = 16
    inv_freq = compute_inv_freq(head_dim, 10000.0, LLAMA3_SCALING)
    hf_inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](
        hf_rope_config(head_dim, 10000.0, LLAMA3_SCALING)
    )
    torch.testing.assert_close(inv_freq, hf_inv_freq, rtol=0, atol=0)
    ratio = compute_inv_freq(head_dim, 10000.0, None) / inv_freq
    assert ratio[0] == 1.0  # high frequency: kept
    assert 1.0 < ratio[1] < 8.0  # medium: smoothed
    assert ratio[-1] == pytest.approx(8.0)  # low frequency: divided by factor


def test_rotary_unknown_type_lists_supported() -> None:
    with pytest.raises(ValueError, match="'dynamic'.*default.*llama3"):
        RotaryEmbedding(16, 64, 10000.0, {"rope_type": "dynamic", "factor": 2.0})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_hf(dtype: torch.dtype) -> None:
    hf_norm = LlamaRMSNorm(48, eps=1e-5)
    hf_norm.weight.data = torch.rand(48) + 0.5
    hf_norm = hf_norm.to(dtype)
    norm = RMSNorm(48, eps=1e-5, dtype=dtype)
    norm.weight.data.copy_(hf_norm.weight.data)
    x = torch.randn(5, 48).to(dtype) * 3
    residual = torch.randn(5, 48).to(dtype)
    torch.testing.assert_close(norm(x), hf_norm(x), rtol=0, atol=0)
    normed, new_residual = norm(x, residual)
    torch.testing.assert_close(new_residual, x + residual, rtol=0, atol=0)
    torch.testing.assert_close(normed, hf_norm(x + residual), rtol=0, atol=0)
    assert normed.dtype == dtype


def test_silu_and_mul() -> None:
    x = torch.randn(6, 2 * 24)
    torch.testing.assert_close(SiluAndMul()(x), F.silu(x[:, :24]) * x[:, 24:])


def build_on_rank(monkeypatch: pytest.MonkeyPatch, module, rank: int, tp_size: int, make):
    monkeypatch.setattr(module, "get_tp_rank_size", lambda: (rank, tp_size))
    return make()


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_qkv_shards_by_heads_and_replicates_kv(
    monkeypatch: pytest.MonkeyPatch, tp_size: int
) -> None:
    hidden, head_dim, num_heads, num_kv_heads = 16, 4, 4, 2
    full = {
        name: torch.randn(n * head_dim, hidden)
        for name, n in (("q", num_heads), ("k", num_kv_heads), ("v", num_kv_heads))
    }
    x = torch.randn(3, hidden)
    ref = {name: x @ w.T for name, w in full.items()}
    kv_per_rank = max(1, num_kv_heads // tp_size) * head_dim
    for rank in range(tp_size):
        layer = build_on_rank(
            monkeypatch,
            linear_module,
            rank,
            tp_size,
            lambda: QKVParallelLinear(hidden, head_dim, num_heads, num_kv_heads),
        )
        for name, w in full.items():
            layer.weight.weight_loader(layer.weight, w, name)
        q, k, v = layer(x).split([layer.q_size, layer.kv_size, layer.kv_size], dim=-1)
        q_size = num_heads // tp_size * head_dim
        kv_head = rank * num_kv_heads // tp_size  # first KV head this rank serves
        torch.testing.assert_close(q, ref["q"][:, rank * q_size : (rank + 1) * q_size])
        kv_cols = slice(kv_head * head_dim, kv_head * head_dim + kv_per_rank)
        torch.testing.assert_close(k, ref["k"][:, kv_cols])
        torch.testing.assert_close(v, ref["v"][:, kv_cols])


def test_merged_and_row_parallel_sum_to_full(monkeypatch: pytest.MonkeyPatch) -> None:
    tp_size, hidden, inter = 2, 8, 12
    gate, up, down = (
        torch.randn(inter, hidden),
        torch.randn(inter, hidden),
        torch.randn(hidden, inter),
    )
    x = torch.randn(3, hidden)
    expected = (F.silu(x @ gate.T) * (x @ up.T)) @ down.T
    total = torch.zeros_like(expected)
    for rank in range(tp_size):
        gate_up = build_on_rank(
            monkeypatch,
            linear_module,
            rank,
            tp_size,
            lambda: MergedColumnParallelLinear(hidden, [inter, inter]),
        )
        row = build_on_rank(
            monkeypatch, linear_module, rank, tp_size, lambda: RowParallelLinear(inter, hidden)
        )
        gate_up.weight.weight_loader(gate_up.weight, gate, 0)
        gate_up.weight.weight_loader(gate_up.weight, up, 1)
        row.weight.weight_loader(row.weight, down)
        # The all-reduce is the sum over ranks; here F.linear gives each rank's partial.
        total += F.linear(SiluAndMul()(gate_up(x)), row.weight)
    torch.testing.assert_close(total, expected)


def test_indivisible_sizes_name_the_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear_module, "get_tp_rank_size", lambda: (0, 4))
    with pytest.raises(ValueError, match=r"heads \(6\).*\(4\)"):
        QKVParallelLinear(16, 4, 6, 2)
    with pytest.raises(ValueError, match=r"\(4\).*KV heads \(3\)"):
        QKVParallelLinear(16, 4, 8, 3)
    with pytest.raises(ValueError, match=r"\(10\).*\(4\)"):
        MergedColumnParallelLinear(16, [10, 10])


@pytest.mark.parametrize("tp_size", [1, 2])
def test_vocab_parallel_embedding_and_lm_head(
    monkeypatch: pytest.MonkeyPatch, tp_size: int
) -> None:
    vocab, hidden = 100, 8  # padded to 128 at tp 1 and 2
    weight = torch.randn(vocab, hidden)
    input_ids = torch.tensor([0, 5, 63, 64, 99, 70])
    hidden_states = torch.randn(4, hidden)
    ops = LayerOps(reduce=lambda x, n: x)  # the test adds the ranks' parts itself
    embedded, logits = 0, []
    for rank in range(tp_size):
        monkeypatch.setattr(embedding_module, "get_tp_rank_size", lambda r=rank: (r, tp_size))
        embed, head = VocabParallelEmbedding(vocab, hidden, ops=ops), ParallelLMHead(vocab, hidden)
        embed.weight.weight_loader(embed.weight, weight)
        head.weight.weight_loader(head.weight, weight)
        assert embed.num_embeddings_padded == 128 and embed.shard_size == 128 // tp_size
        embedded = embedded + embed(input_ids)
        logits.append(F.linear(hidden_states, head.weight))
    torch.testing.assert_close(embedded, weight[input_ids])
    full_logits = torch.cat(logits, dim=-1)
    torch.testing.assert_close(full_logits[:, :vocab], hidden_states @ weight.T)
    assert (full_logits[:, vocab:] == 0).all()  # padding rows are zeroed
    if tp_size == 1:
        assert head.compute_logits(hidden_states).shape == (4, vocab)
