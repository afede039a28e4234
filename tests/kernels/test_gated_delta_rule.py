"""The gated delta rule kernels (kernels/gated_delta/prefill.py, decode.py) against the torch
definitions (layers/gated_delta.py): packed ragged sequences across the 64-token chunks,
initial states at shuffled slots, GQA-style value heads, decode chained after prefill."""

from __future__ import annotations

import pytest
import torch
from paged_case import DEVICE

from minivllm.kernels.gated_delta import decode, prefill
from minivllm.kernels.gated_delta.chunk_layout import chunk_layout
from minivllm.layers import gated_delta as ref

DTYPES = [torch.float32, torch.float16]


def _tol(dtype):
    # float16 keeps the kernels' w, u, v_new and per-chunk states in float16 (the state
    # carried across chunks stays float32); the reference computes all in float32.
    return {"atol": 2e-5, "rtol": 2e-5} if dtype == torch.float32 else {"atol": 1e-2, "rtol": 1e-2}


def decays(num_tokens, num_v_heads, gen):
    """Log decays g [T, H_v]: even heads forget within a few tokens, odd heads keep their
    state over hundreds (so the state carried across chunks and the coupling between far rows
    of a chunk both count)."""
    scale = torch.tensor([1.5, 0.01]).repeat(num_v_heads)[:num_v_heads]
    return -torch.rand(num_tokens, num_v_heads, generator=gen) * scale


def make_rule_inputs(num_tokens, num_k_heads, num_v_heads, d_k, d_v, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(num_tokens, (2 * num_k_heads) * d_k + num_v_heads * d_v, generator=gen)
    # Keys share a direction (k_i . k_j ~ 0.5 after the norm), as real keys do: the chunk's
    # triangular system is then far from the identity.
    shared = torch.randn(num_k_heads * d_k, generator=gen)
    qkv[:, num_k_heads * d_k : 2 * num_k_heads * d_k] += shared
    qkv = qkv.to(dtype)  # q, k, v are strided views of one buffer, as after the conv
    q = qkv[:, : num_k_heads * d_k].view(num_tokens, num_k_heads, d_k)
    k = qkv[:, num_k_heads * d_k : 2 * num_k_heads * d_k].view(num_tokens, num_k_heads, d_k)
    v = qkv[:, 2 * num_k_heads * d_k :].view(num_tokens, num_v_heads, d_v)
    g = decays(num_tokens, num_v_heads, gen)
    beta = torch.rand(num_tokens, num_v_heads, generator=gen)
    return q, k, v, g, beta


def _to(*ts):
    return [t.to(DEVICE) for t in ts]


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(2, 2, 32, 32), (1, 2, 32, 48)], ids=["mha", "gva"])
def test_prefill_matches_reference(dtype, heads):
    num_k_heads, num_v_heads, d_k, d_v = heads
    lens = [1, 70, 0, 64, 130]  # one token, across a chunk edge, empty, one chunk, 3 chunks
    q, k, v, g, beta = make_rule_inputs(sum(lens), *heads, dtype, seed=len(lens) + d_v)
    gen = torch.Generator().manual_seed(1)
    state = torch.randn(8, num_v_heads, d_k, d_v, generator=gen) * 0.5
    slots = torch.tensor([6, 0, 3, 5, 2], dtype=torch.int32)
    has_init = torch.tensor([True, False, True, True, True])
    expected_state = state.clone()
    expected = ref.gated_delta_rule_prefill(
        q, k, v, g, beta, _cu(lens), expected_state, slots, has_init, use_qk_l2norm=True
    )
    got_state = state.clone().to(DEVICE)
    out = prefill.gated_delta_rule_prefill(
        *_to(q, k, v, g, beta, _cu(lens)), got_state, *_to(slots, has_init), use_qk_l2norm=True
    )
    torch.testing.assert_close(out.cpu(), expected, **_tol(dtype))
    torch.testing.assert_close(got_state.cpu(), expected_state, **_tol(dtype))
    assert torch.equal(got_state.cpu()[[1, 3, 4, 7]], state[[1, 3, 4, 7]])  # untouched slots


@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_without_l2norm_and_with_scale(dtype):
    """Inputs the layer has already normalized, a given scale, one sequence of 2 chunks."""
    q, k, v, g, beta = make_rule_inputs(100, 1, 2, 16, 16, dtype, seed=4)
    q, k = ref.l2_normalize(q).to(dtype), ref.l2_normalize(k).to(dtype)
    state = torch.zeros(1, 2, 16, 16)
    args = (torch.tensor([0, 100], dtype=torch.int32),)
    slot, no_init = torch.tensor([0], dtype=torch.int32), torch.tensor([False])
    expected = ref.gated_delta_rule_prefill(
        q, k, v, g, beta, *args, state.clone(), slot, no_init, scale=0.3
    )
    out = prefill.gated_delta_rule_prefill(
        *_to(q, k, v, g, beta, *args, state, slot, no_init), scale=0.3
    )
    torch.testing.assert_close(out.cpu(), expected, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_matches_reference(dtype):
    q, k, v, g, beta = make_rule_inputs(5, 2, 4, 32, 48, dtype, seed=9)
    state = torch.randn(7, 4, 32, 48, generator=torch.Generator().manual_seed(2))
    slots = torch.tensor([3, -1, 0, 6, 1], dtype=torch.int32)  # row 1 is padding
    expected_state = state.clone()
    expected = ref.gated_delta_rule_decode(
        q, k, v, g, beta, expected_state, slots, use_qk_l2norm=True
    )
    got_state = state.clone().to(DEVICE)
    out = decode.gated_delta_rule_decode(
        *_to(q, k, v, g, beta), got_state, slots.to(DEVICE), use_qk_l2norm=True
    )
    torch.testing.assert_close(out.cpu(), expected, **_tol(dtype))
    assert (out[1] == 0).all()
    torch.testing.assert_close(got_state.cpu(), expected_state, **_tol(dtype))
    assert torch.equal(got_state.cpu()[[2, 4, 5]], state[[2, 4, 5]])


def test_decode_to_other_slots_matches_reference():
    """A verify step's rows: each reads its state at one slot and writes it at another (the
    state after a draft), with the bits of the step in place; the slots read stay."""
    q, k, v, g, beta = make_rule_inputs(3, 2, 4, 32, 48, torch.float32, seed=4)
    state = torch.randn(7, 4, 32, 48, generator=torch.Generator().manual_seed(3))
    src = torch.tensor([3, 0, -1], dtype=torch.int32)
    dst = torch.tensor([5, 0, 2], dtype=torch.int32)  # row 1 in place; row 2 padding
    expected_state = state.clone()
    expected = ref.gated_delta_rule_decode(
        q, k, v, g, beta, expected_state, src, use_qk_l2norm=True, dst_slots=dst
    )
    in_place = state.clone()
    ref.gated_delta_rule_decode(q, k, v, g, beta, in_place, src, use_qk_l2norm=True)
    assert torch.equal(expected_state[5], in_place[3]) and torch.equal(expected_state[3], state[3])
    got_state = state.clone().to(DEVICE)
    out = decode.gated_delta_rule_decode(
        *_to(q, k, v, g, beta), got_state, src.to(DEVICE), use_qk_l2norm=True,
        dst_slots=dst.to(DEVICE),
    )  # fmt: skip
    torch.testing.assert_close(out.cpu(), expected, **_tol(torch.float32))
    torch.testing.assert_close(got_state.cpu(), expected_state, **_tol(torch.float32))
    assert torch.equal(got_state.cpu()[[1, 2, 3, 4, 6]], state[[1, 2, 3, 4, 6]])


def test_decode_of_picked_rows():
    """rows: request i's token is row rows[i] of the inputs and of out (other rows of out
    untouched), as the step of those rows gathered."""
    q, k, v, g, beta = make_rule_inputs(5, 2, 4, 32, 48, torch.float32, seed=5)
    state = torch.randn(7, 4, 32, 48, generator=torch.Generator().manual_seed(4))
    rows = torch.tensor([3, 0], dtype=torch.int64)
    src = torch.tensor([6, 2], dtype=torch.int32)
    dst = torch.tensor([1, 2], dtype=torch.int32)
    expected_state = state.clone()
    expected = ref.gated_delta_rule_decode(
        q[rows], k[rows], v[rows], g[rows], beta[rows], expected_state, src,
        use_qk_l2norm=True, dst_slots=dst,
    )  # fmt: skip
    got_state, out = state.clone().to(DEVICE), torch.full(v.shape, 7.0, device=DEVICE)
    got = decode.gated_delta_rule_decode(
        *_to(q, k, v, g, beta), got_state, src.to(DEVICE), use_qk_l2norm=True,
        dst_slots=dst.to(DEVICE), rows=rows.to(DEVICE), out=out,
    )  # fmt: skip
    assert got is out
    torch.testing.assert_close(out.cpu()[rows], expected, **_tol(torch.float32))
    assert (out.cpu()[[1, 2, 4]] == 7.0).all()
    torch.testing.assert_close(got_state.cpu(), expected_state, **_tol(torch.float32))
    ref_out = ref.gated_delta_rule_decode(
        q, k, v, g, beta, state.clone(), src, use_qk_l2norm=True, dst_slots=dst, rows=rows
    )
    torch.testing.assert_close(ref_out[rows], expected, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_steps_chained_equal_prefill(dtype):
    """Prefill prompts of 66 and 3 tokens, then decode 4 tokens each: the outputs and final
    states equal one prefill over the whole sequences (kernel against kernel)."""
    prompt_lens, steps = [66, 3], 4
    lens = [n + steps for n in prompt_lens]
    q, k, v, g, beta = make_rule_inputs(sum(lens), 2, 4, 32, 32, dtype, seed=12)
    q, k, v, g, beta = _to(q, k, v, g, beta)
    slots = torch.tensor([2, 0], dtype=torch.int32).to(DEVICE)
    no_init = torch.tensor([False, False]).to(DEVICE)
    whole_state = torch.zeros(3, 4, 32, 32, device=DEVICE)
    whole = prefill.gated_delta_rule_prefill(
        q, k, v, g, beta, _cu(lens).to(DEVICE), whole_state, slots, no_init, use_qk_l2norm=True
    )
    starts = _cu(lens)[:-1].tolist()
    prompt_rows = [r for s, n in zip(starts, prompt_lens) for r in range(s, s + n)]
    state = torch.full((3, 4, 32, 32), float("nan"), device=DEVICE)
    out = prefill.gated_delta_rule_prefill(
        q[prompt_rows], k[prompt_rows], v[prompt_rows], g[prompt_rows], beta[prompt_rows],
        _cu(prompt_lens).to(DEVICE), state, slots, no_init, use_qk_l2norm=True,
    )  # fmt: skip
    torch.testing.assert_close(out, whole[prompt_rows], **_tol(dtype))
    for step in range(steps):
        rows = [s + n + step for s, n in zip(starts, prompt_lens)]
        out = decode.gated_delta_rule_decode(
            q[rows], k[rows], v[rows], g[rows], beta[rows], state, slots, use_qk_l2norm=True
        )
        torch.testing.assert_close(out, whole[rows], **_tol(dtype))
    torch.testing.assert_close(state[[0, 2]], whole_state[[0, 2]], **_tol(dtype))
    assert state[1].isnan().all()


def test_checks_refuse_bad_inputs():
    q, k, v, g, beta = make_rule_inputs(4, 2, 3, 16, 16, torch.float32, seed=0)
    state = torch.zeros(2, 3, 16, 16)
    with pytest.raises(ValueError, match="multiple of H_k"):
        decode.gated_delta_rule_decode(q, k, v, g, beta, state, torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="float32"):
        decode.gated_delta_rule_decode(
            q, k, v[:, :2], g[:, :2], beta[:, :2], state[:, :2].half(),
            torch.zeros(4, dtype=torch.int32),
        )  # fmt: skip


def test_chunk_layout():
    layout = chunk_layout([0, 1, 1, 130], "cpu")  # 1 token, an empty sequence, 129 tokens
    assert layout.chunk_table.tolist() == [[0, 0], [2, 1], [2, 65], [2, 129]]
    assert layout.cu_chunks.tolist() == [0, 1, 1, 4]
    assert layout.num_chunks == 4
    with pytest.raises(ValueError, match="non-decreasing"):
        chunk_layout([0, 5, 3], "cpu")
