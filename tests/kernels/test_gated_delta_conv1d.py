"""The causal conv1d kernels (kernels/gated_delta/conv1d.py) against the torch definitions
(layers/causal_conv1d.py): packed ragged sequences, conv states in and out at shuffled slots."""

from __future__ import annotations

import pytest
import torch
from paged_case import DEVICE

from minivllm.kernels.gated_delta import chunk_kernels, decode
from minivllm.kernels.gated_delta import conv1d as kernel
from minivllm.layers import causal_conv1d as ref

DTYPES = [torch.float32, torch.float16]


def _tol(dtype):
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-3, "rtol": 2e-3}


def _case(lens, channels, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    wide = torch.randn(sum(lens), channels + 8, generator=gen).to(dtype)
    x = wide[:, 3 : 3 + channels]  # strided rows, as a slice of the in-projection
    weight = torch.randn(channels, 4, generator=gen).to(dtype)
    bias = torch.randn(channels, generator=gen).to(dtype)
    conv_state = torch.randn(len(lens) + 3, 3, channels, generator=gen).to(dtype)
    slots = torch.randperm(len(lens) + 3, generator=gen)[: len(lens)].to(torch.int32)
    return x, weight, bias, conv_state, slots


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_conv1d_prefill(dtype, with_bias):
    # Lengths below, at and across the 64-token chunk and shorter than the state (1, 2).
    lens = [1, 70, 2, 64, 0, 5, 130]
    x, weight, bias, conv_state, slots = _case(lens, 40, dtype, seed=len(lens) + with_bias)
    bias = bias if with_bias else None
    has_init = torch.tensor([True, False, True, True, False, False, True])
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    expected_state = conv_state.clone()
    expected = ref.causal_conv1d_prefill(x, weight, bias, cu, expected_state, slots, has_init)
    dev = [t.to(DEVICE) if t is not None else None for t in (x, weight, bias, conv_state)]
    state = conv_state.clone().to(DEVICE)
    out = kernel.causal_conv1d_prefill(
        dev[0], dev[1], dev[2], cu.to(DEVICE), state, slots.to(DEVICE), has_init.to(DEVICE)
    )
    torch.testing.assert_close(out.cpu(), expected, **_tol(dtype))
    torch.testing.assert_close(state.cpu(), expected_state, atol=0, rtol=0)
    assert not torch.equal(expected_state, conv_state)  # the case does move the states


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv1d_update_chained_equals_prefill(dtype):
    """Prefill a prefix, then one update per token: outputs and states as one prefill."""
    lens, prefix = [9, 3], 4
    x, weight, bias, conv_state, slots = _case(lens, 24, dtype, seed=11)
    cu = torch.tensor([0, 9, 12], dtype=torch.int32)
    no_init = torch.tensor([False, False])
    whole_state = conv_state.clone()
    whole = ref.causal_conv1d_prefill(x, weight, bias, cu, whole_state, slots, no_init)
    state = conv_state.to(DEVICE)
    rows = [list(range(0, prefix)), list(range(9, 9 + 2))]  # prefixes of 4 and 2 tokens
    firsts = torch.tensor([r for seq in rows for r in seq])
    cu_first = torch.tensor([0, prefix, prefix + 2], dtype=torch.int32)
    out = kernel.causal_conv1d_prefill(
        x[firsts].to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), cu_first.to(DEVICE), state,
        slots.to(DEVICE), no_init.to(DEVICE),
    )  # fmt: skip
    torch.testing.assert_close(out.cpu(), whole[firsts], **_tol(dtype))
    # Decode the rest one token a step; request 1 finishes first and then is a padded row.
    nexts = [list(range(prefix, 9)), [11]]
    for step in range(len(nexts[0])):
        idx = [seq[step] if step < len(seq) else 0 for seq in nexts]
        step_slots = torch.tensor(
            [int(slots[i]) if step < len(seq) else -1 for i, seq in enumerate(nexts)],
            dtype=torch.int32,
        )
        out = kernel.causal_conv1d_update(
            x[idx].to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), state, step_slots.to(DEVICE)
        )
        for i, seq in enumerate(nexts):
            if step < len(seq):
                torch.testing.assert_close(out[i].cpu(), whole[seq[step]], **_tol(dtype))
            else:
                assert (out[i] == 0).all()
    torch.testing.assert_close(state.cpu(), whole_state, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv1d_update_matches_reference(dtype):
    x, weight, bias, conv_state, slots = _case([1] * 5, 300, dtype, seed=5)
    slots[2] = -1
    expected_state = conv_state.clone()
    expected = ref.causal_conv1d_update(x, weight, None, expected_state, slots, None)
    state = conv_state.to(DEVICE)
    out = kernel.causal_conv1d_update(
        x.to(DEVICE), weight.to(DEVICE), None, state, slots.to(DEVICE), None
    )
    torch.testing.assert_close(out.cpu(), expected, **_tol(dtype))
    torch.testing.assert_close(state.cpu(), expected_state, atol=0, rtol=0)


def test_conv1d_update_to_other_slots_matches_reference():
    """A verify step's rows: each reads its state at one slot and writes the shifted state at
    another (the state after a draft); the slots read stay as they were."""
    x, weight, bias, conv_state, slots = _case([1] * 4, 300, torch.float32, seed=6)
    src, dst = slots[:2], slots[2:].clone()
    dst[1] = slots[1]  # one row writes back in place, as a verify chain's last row does
    x = x[:2]
    expected_state = conv_state.clone()
    expected = ref.causal_conv1d_update(x, weight, bias, expected_state, src, "silu", dst)
    state = conv_state.to(DEVICE)
    out = kernel.causal_conv1d_update(
        x.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), state, src.to(DEVICE), "silu",
        dst.to(DEVICE),
    )  # fmt: skip
    torch.testing.assert_close(out.cpu(), expected, **_tol(torch.float32))
    torch.testing.assert_close(state.cpu(), expected_state, atol=0, rtol=0)
    assert torch.equal(state.cpu()[src[0]], conv_state[src[0]])  # read, not written
    assert torch.equal(state.cpu()[dst[0], :2], conv_state[src[0], 1:])  # shifted over
    assert torch.equal(state.cpu()[dst[0], 2], x[0])


def test_conv1d_update_of_picked_rows():
    """rows: request i's token is row rows[i] of x and of out (other rows of out untouched),
    as the one-token update of those rows gathered."""
    x, weight, bias, conv_state, slots = _case([1] * 5, 300, torch.float32, seed=7)
    rows = torch.tensor([4, 1], dtype=torch.int64)
    src, dst = slots[:2], slots[2:4]
    expected_state = conv_state.clone()
    expected = ref.causal_conv1d_update(x[rows], weight, bias, expected_state, src, "silu", dst)
    state, out = conv_state.to(DEVICE), torch.full(x.shape, 7.0, device=DEVICE)
    got = kernel.causal_conv1d_update(
        x.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), state, src.to(DEVICE), "silu",
        dst.to(DEVICE), rows=rows.to(DEVICE), out=out,
    )  # fmt: skip
    assert got is out
    torch.testing.assert_close(out.cpu()[rows], expected, **_tol(torch.float32))
    assert (out.cpu()[[0, 2, 3]] == 7.0).all()
    torch.testing.assert_close(state.cpu(), expected_state, atol=0, rtol=0)
    ref_out = ref.causal_conv1d_update(
        x, weight, bias, conv_state.clone(), src, "silu", dst, rows=rows, out=torch.zeros_like(x)
    )
    torch.testing.assert_close(ref_out[rows], expected, atol=0, rtol=0)


def test_step_metadata_is_not_specialized():
    """The per-step tables and slots may be slices of persistent buffers: a new offset must not
    compile the kernels again. Triton ignores a misspelled name, so each must be a parameter."""
    step_pointers = {"chunk_table_ptr", "cu_seqlens_ptr", "cu_chunks_ptr", "slots_ptr",
                     "dst_slots_ptr", "rows_ptr", "has_init_ptr"}  # fmt: skip
    for k in (
        kernel._conv1d_prefill_kernel, kernel._conv1d_update_kernel,
        chunk_kernels._chunk_prepare_kernel, chunk_kernels._chunk_state_kernel,
        chunk_kernels._chunk_output_kernel, decode._recurrent_step_kernel,
    ):  # fmt: skip
        # JITFunction keeps the list as an attribute, the interpreter's function in kwargs.
        listed = getattr(k, "do_not_specialize_on_alignment", None)
        listed = set(listed or getattr(k, "kwargs", {}).get("do_not_specialize_on_alignment"))
        assert listed == step_pointers & set(k.arg_names), k.fn.__name__
