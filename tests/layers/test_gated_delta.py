"""The torch gated delta rule and causal conv1d (layers/gated_delta.py, layers/causal_conv1d.py)
against HF transformers' qwen3_5 functions, the oracle."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from minivllm.layers.causal_conv1d import causal_conv1d_prefill, causal_conv1d_update
from minivllm.layers.gated_delta import (
    chunk_gated_delta_rule_one,
    gated_delta_rule_decode,
    gated_delta_rule_prefill,
)

TOL = {"atol": 2e-5, "rtol": 2e-5}


def make_inputs(seq_len, num_k_heads, num_v_heads, d_k, d_v, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(seq_len, num_k_heads, d_k, generator=gen)
    # Keys share a direction (k_i . k_j ~ 0.5 after the norm), as real keys do.
    k = torch.randn(seq_len, num_k_heads, d_k, generator=gen) + torch.randn(d_k, generator=gen)
    v = torch.randn(seq_len, num_v_heads, d_v, generator=gen)
    # Even heads forget within a few tokens, odd heads keep their state over hundreds.
    scale = torch.tensor([2.0, 0.01]).repeat(num_v_heads)[:num_v_heads]
    g = -torch.rand(seq_len, num_v_heads, generator=gen) * scale
    beta = torch.rand(seq_len, num_v_heads, generator=gen)
    return q, k, v, g, beta


def hf_rule(fn, q, k, v, g, beta, initial_state):
    out, state = fn(
        q[None], k[None], v[None], g[None], beta[None],
        initial_state=None if initial_state is None else initial_state[None],
        output_final_state=True, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    return out[0], state[0]


@pytest.mark.parametrize("seq_len", [1, 37, 64, 150])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunked_rule_matches_hf(seq_len, with_state):
    q, k, v, g, beta = make_inputs(seq_len, 2, 4, 16, 8, seed=seq_len)
    init = torch.randn(4, 16, 8) if with_state else None
    expected, expected_state = hf_rule(hf.torch_chunk_gated_delta_rule, q, k, v, g, beta, init)
    state = torch.full((3, 4, 16, 8), float("nan"))
    if with_state:
        state[2] = init
    out = gated_delta_rule_prefill(
        q, k, v, g, beta, torch.tensor([0, seq_len]), state, torch.tensor([2]),
        torch.tensor([with_state]), use_qk_l2norm=True,
    )  # fmt: skip
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(state[2], expected_state, **TOL)
    assert state[[0, 1]].isnan().all()  # other slots untouched


def test_chunked_rule_matches_hf_recurrent_over_long_decay():
    """Against the token-by-token definition, across three chunk boundaries."""
    q, k, v, g, beta = make_inputs(200, 1, 2, 32, 16, seed=3)
    expected, expected_state = hf_rule(hf.torch_recurrent_gated_delta_rule, q, k, v, g, beta, None)
    q = hf.l2norm(q) * 32**-0.5
    out, state = chunk_gated_delta_rule_one(q, hf.l2norm(k), v, g, beta)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state, expected_state, atol=1e-4, rtol=1e-4)


def test_decode_step_matches_hf_recurrent():
    num_requests, slots = 3, torch.tensor([4, -1, 0])
    q, k, v, g, beta = make_inputs(num_requests, 2, 4, 16, 8, seed=5)
    state = torch.randn(5, 4, 16, 8)
    before = state.clone()
    out = gated_delta_rule_decode(q, k, v, g, beta, state, slots, use_qk_l2norm=True)
    for row, slot in ((0, 4), (2, 0)):
        expected, expected_state = hf_rule(
            hf.torch_recurrent_gated_delta_rule,
            q[row : row + 1], k[row : row + 1], v[row : row + 1], g[row : row + 1],
            beta[row : row + 1], before[slot],
        )  # fmt: skip
        torch.testing.assert_close(out[row], expected[0], **TOL)
        torch.testing.assert_close(state[slot], expected_state, **TOL)
    assert (out[1] == 0).all()
    torch.testing.assert_close(state[1:4], before[1:4], atol=0, rtol=0)


@pytest.mark.parametrize("with_state", [False, True])
def test_conv1d_prefill_and_update_match_hf(with_state):
    gen = torch.Generator().manual_seed(7)
    channels, width, lens = 12, 4, [2, 9]
    x = torch.randn(sum(lens), channels, generator=gen)
    weight = torch.randn(channels, width, generator=gen)
    conv_state = torch.randn(3, width - 1, channels, generator=gen)
    before = conv_state.clone()
    slots = torch.tensor([2, 0])
    has_state = torch.tensor([with_state, with_state])
    cu = torch.tensor([0, 2, 11])
    out = causal_conv1d_prefill(x, weight, None, cu, conv_state, slots, has_state, "silu")
    for i, slot in enumerate(slots.tolist()):
        seq = x[cu[i] : cu[i + 1]]
        history = before[slot] if with_state else torch.zeros(width - 1, channels)
        hf_state = history.t()[None].clone()  # HF's layout: [batch, C, width - 1]
        expected = hf.causal_conv1d_update(seq.t()[None], hf_state, weight, None, "silu")
        torch.testing.assert_close(out[cu[i] : cu[i + 1]], expected[0].t(), **TOL)
        torch.testing.assert_close(conv_state[slot], hf_state[0].t(), atol=0, rtol=0)
    # One step more for both, through the update path.
    step = torch.randn(2, channels, generator=gen)
    mid = conv_state.clone()
    out = causal_conv1d_update(step, weight, None, conv_state, slots, "silu")
    for i, slot in enumerate(slots.tolist()):
        hf_state = mid[slot].t()[None].clone()
        expected = hf.causal_conv1d_update(step[i, :, None][None], hf_state, weight, None, "silu")
        torch.testing.assert_close(out[i], expected[0, :, 0], **TOL)
        torch.testing.assert_close(conv_state[slot], hf_state[0].t(), atol=0, rtol=0)
    torch.testing.assert_close(conv_state[1], before[1], atol=0, rtol=0)
