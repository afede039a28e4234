"""GPU: the gated delta kernels at Qwen3.5's shapes (16 q/k heads, 32 value heads, head dims 128,
conv over 8,192 channels) in bf16 and float32 against the torch definitions in float32:
prompts of thousands of tokens packed with short ones, then chained decode steps.
(Triton's interpreter cannot check bf16: its tl.dot reads bf16 operands wrongly.)"""

from __future__ import annotations

import pytest
import torch

from minivllm.kernels.gated_delta import conv1d, decode, prefill
from minivllm.layers import causal_conv1d as conv_ref
from minivllm.layers import gated_delta as ref

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

H_K, H_V, D = 16, 32, 128
LENS = [3000, 1, 64, 130, 517]
# Error against the float32 reference, relative to the reference's size: the mean error to
# the mean magnitude, the worst element to the largest. In the interpreter float16 (3 mantissa
# bits more than bf16) stayed within 0.1 % of the largest; bf16 keeps w, u, v_new and the
# per-chunk states in bf16, ~8x coarser.
TOL = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (1e-2, 5e-2)}


def _close(got, expected, dtype):
    mean_tol, max_tol = TOL[dtype]
    err = (got.float().cpu() - expected.float().cpu()).abs()
    size = expected.float().cpu().abs()
    mean_rel, max_rel = (err.mean() / size.mean()).item(), (err.max() / size.max()).item()
    assert mean_rel < mean_tol and max_rel < max_tol, (mean_rel, max_rel)


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rule_prefill_then_decode(dtype):
    gen = torch.Generator().manual_seed(0)
    steps, total = 3, sum(LENS)
    # Inputs in the kernel's dtype; the reference computes from the same values in float32.
    qkv = torch.randn(total + steps * len(LENS), (2 * H_K + H_V) * D, generator=gen)
    qkv[:, H_K * D : 2 * H_K * D] += torch.randn(H_K * D, generator=gen)  # keys share a direction
    qkv = qkv.to(dtype)
    q = qkv[:, : H_K * D].view(-1, H_K, D)
    k = qkv[:, H_K * D : 2 * H_K * D].view(-1, H_K, D)
    v = qkv[:, 2 * H_K * D :].view(-1, H_V, D)
    # Half the heads forget within a few tokens, half keep their state over hundreds.
    g = -torch.rand(qkv.shape[0], H_V, generator=gen) * torch.tensor([3.0, 0.01]).repeat(H_V // 2)
    beta = torch.rand(qkv.shape[0], H_V, generator=gen).to(dtype)
    state = torch.randn(8, H_V, D, D, generator=gen) * 0.1
    slots = torch.tensor([5, 0, 7, 2, 3], dtype=torch.int32)
    has_init = torch.tensor([True, False, True, False, True])
    args = (_cu(LENS), state.clone(), slots, has_init)
    expected = ref.gated_delta_rule_prefill(
        q[:total], k[:total], v[:total], g[:total], beta[:total], *args, use_qk_l2norm=True
    )
    expected_state = args[1]
    qkv_d, gd, bd, got_state = qkv.cuda(), g.cuda(), beta.cuda(), state.cuda()
    qd = qkv_d[:, : H_K * D].view(-1, H_K, D)
    kd = qkv_d[:, H_K * D : 2 * H_K * D].view(-1, H_K, D)
    vd = qkv_d[:, 2 * H_K * D :].view(-1, H_V, D)
    out = prefill.gated_delta_rule_prefill(
        qd[:total], kd[:total], vd[:total], gd[:total], bd[:total], _cu(LENS).cuda(), got_state,
        slots.cuda(), has_init.cuda(), use_qk_l2norm=True,
    )  # fmt: skip
    _close(out, expected, dtype)
    _close(got_state.cpu(), expected_state, dtype)
    for step in range(steps):
        rows = list(range(total + step * len(LENS), total + (step + 1) * len(LENS)))
        expected = ref.gated_delta_rule_decode(
            q[rows], k[rows], v[rows], g[rows], beta[rows], expected_state, slots,
            use_qk_l2norm=True,
        )  # fmt: skip
        out = decode.gated_delta_rule_decode(
            qd[rows], kd[rows], vd[rows], gd[rows], bd[rows], got_state, slots.cuda(),
            use_qk_l2norm=True,
        )  # fmt: skip
        _close(out, expected, dtype)
    _close(got_state.cpu(), expected_state, dtype)


def _conv_prefill_both(x, weight, conv_state, lens, slots, has_init):
    """The conv prefill by the torch definition (on CPU copies) and by the kernel (on the GPU):
    (expected, expected_state, out, got_state)."""
    expected_state = conv_state.clone()
    expected = conv_ref.causal_conv1d_prefill(
        x, weight, None, _cu(lens), expected_state, slots, has_init
    )
    got_state = conv_state.cuda()
    out = conv1d.causal_conv1d_prefill(
        x.cuda(), weight.cuda(), None, _cu(lens).cuda(), got_state, slots.cuda(), has_init.cuda()
    )
    return expected, expected_state, out, got_state


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv1d_prefill_then_update(dtype):
    gen = torch.Generator().manual_seed(1)
    channels = (2 * H_K + H_V) * D
    x = torch.randn(sum(LENS), channels, generator=gen).to(dtype)
    weight = torch.randn(channels, 4, generator=gen).to(dtype)
    conv_state = torch.randn(8, 3, channels, generator=gen).to(dtype)
    slots = torch.tensor([5, 0, 7, 2, 3], dtype=torch.int32)
    has_init = torch.tensor([True, False, True, False, True])
    expected, expected_state, out, got_state = _conv_prefill_both(
        x, weight, conv_state, LENS, slots, has_init
    )
    _close(out, expected, dtype)
    assert torch.equal(got_state.cpu(), expected_state)
    step = torch.randn(len(LENS), channels, generator=gen).to(dtype)
    expected = conv_ref.causal_conv1d_update(step, weight, None, expected_state, slots)
    out = conv1d.causal_conv1d_update(step.cuda(), weight.cuda(), None, got_state, slots.cuda())
    _close(out, expected, dtype)
    assert torch.equal(got_state.cpu(), expected_state)


@pytest.mark.parametrize("channels", [96, 8192])
def test_conv1d_prefill_shorter_than_the_state(channels):
    """Sequences of 1 and 2 tokens continuing from a conv state (a prompt's last tokens after a
    chunk that ended on a prefix-cache snapshot): the new state takes rows of the old one, read
    by the program's threads before any of them writes it."""
    gen = torch.Generator().manual_seed(2)
    lens = [1, 2, 2, 1, 2, 3] * 20
    x = torch.randn(sum(lens), channels, generator=gen)
    weight = torch.randn(channels, 4, generator=gen)
    conv_state = torch.randn(len(lens), 3, channels, generator=gen)
    slots = torch.randperm(len(lens), generator=gen).to(torch.int32)
    has_init = torch.ones(len(lens), dtype=torch.bool)
    expected, expected_state, out, got_state = _conv_prefill_both(
        x, weight, conv_state, lens, slots, has_init
    )
    _close(out, expected, torch.float32)
    assert torch.equal(got_state.cpu(), expected_state)
