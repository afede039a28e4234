"""The Gated DeltaNet layer (layers/gated_delta_net.py) against HF's Qwen3_5GatedDeltaNet with
the same weights on a tiny random config: whole prompts packed in one step, and prompts split
over steps (continued chunks, decodes, a padded decode row), with the torch definitions and
with the Triton kernels in the interpreter."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

from minivllm.layers.gated_delta_net import GatedDeltaMeta, GatedDeltaNet

LENS = [5, 70, 2]  # the long one crosses a 64-token chunk
SLOTS = [3, 0, 2]


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


@pytest.fixture(scope="module")
def layers():
    torch.manual_seed(0)
    config = Qwen3_5TextConfig(
        hidden_size=48, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        num_hidden_layers=1, layer_types=["linear_attention"], rms_norm_eps=1e-6,
    )  # fmt: skip
    hf = Qwen3_5GatedDeltaNet(config, layer_idx=0).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name not in ("A_log",):  # A_log keeps HF's init: decays of every strength
                p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 1.0))
    ours = {}
    for use_triton in (False, True):
        layer = GatedDeltaNet(
            48, 2, 4, 16, 16, 4, 1e-6, dtype=torch.float32, use_triton=use_triton
        ).eval()
        layer.load_state_dict(hf.state_dict(), strict=True)
        ours[use_triton] = layer
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randn(n, 48, generator=gen) for n in LENS]
    with torch.no_grad():
        expected = [hf(x[None])[0] for x in prompts]
    return ours, prompts, expected


def _states(layer):
    conv = torch.full((4, 3, layer.conv_dim), float("nan"))
    ssm = torch.full((4, 4, 16, 16), float("nan"))  # never read before it is written
    return conv, ssm


def _step(layer, states, decodes, prefills):
    """decodes: [(slot, row)]; prefills: [(slot, rows, has_initial_state)]."""
    rows = [r for _, r in decodes] + [r for _, rs, _ in prefills for r in rs]
    cu = [0]
    for _, rs, _ in prefills:
        cu.append(cu[-1] + len(rs))
    meta = GatedDeltaMeta(
        num_decodes=len(decodes),
        decode_slots=_i32([s for s, _ in decodes]),
        prefill_cu_seqlens=_i32(cu),
        prefill_slots=_i32([s for s, _, _ in prefills]),
        prefill_has_initial_state=torch.tensor([h for _, _, h in prefills], dtype=torch.bool),
    )
    with torch.no_grad():
        return layer(torch.stack(rows), meta, *states)


@pytest.mark.parametrize("use_triton", [False, True], ids=["torch", "triton"])
def test_whole_prompts_match_hf(layers, use_triton):
    ours, prompts, expected = layers
    layer = ours[use_triton]
    prefills = [(s, list(x), False) for s, x in zip(SLOTS, prompts)]
    out = _step(layer, _states(layer), [], prefills)
    torch.testing.assert_close(out, torch.cat(expected), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("use_triton", [False, True], ids=["torch", "triton"])
def test_prompts_over_steps_match_hf(layers, use_triton):
    ours, prompts, expected = layers
    layer = ours[use_triton]
    a, b, c = prompts
    states = _states(layer)
    pad = torch.randn(48)
    got = _step(layer, states, [], [(3, list(a[:3]), False), (0, list(b[:65]), False)])
    torch.testing.assert_close(got[:3], expected[0][:3], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[3:], expected[1][:65], atol=1e-4, rtol=1e-4)
    got = _step(layer, states, [(3, a[3]), (0, b[65])], [(2, list(c), False)])
    torch.testing.assert_close(got[0], expected[0][3], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[1], expected[1][65], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[2:], expected[2], atol=1e-4, rtol=1e-4)
    got = _step(layer, states, [(3, a[4]), (-1, pad)], [(0, list(b[66:]), True)])
    torch.testing.assert_close(got[0], expected[0][4], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[2:], expected[1][66:], atol=1e-4, rtol=1e-4)
    assert states[1][1].isnan().all()  # the unused slot was never written


@pytest.mark.parametrize("use_triton", [False, True], ids=["torch", "triton"])
def test_verify_rows_equal_decoding_one_a_step(layers, use_triton):
    """A verify step (speculative decoding): a chunk of 3 rows (its token and 2 drafts) of the
    request in slot 0, with draft slots 1 and 2, beside a 1-row chunk in slot 3. Its outputs,
    the request's final states and the draft slots' states (after 1 and 2 tokens) are those
    of decoding the same tokens one a step (to the projections' rounding at another number
    of rows: on the CPU a GEMM's bits may depend on it)."""
    from minivllm.layers.gated_delta_verify import VerifyRows

    ours, prompts, _ = layers
    layer = ours[use_triton]
    a, b, _ = prompts
    states = _states(layer)
    _step(layer, states, [], [(3, list(a[:3]), False), (0, list(b[:65]), False)])
    plain = tuple(s.clone() for s in states)
    expected = [_step(layer, plain, [(0, b[65]), (3, a[3])], [])]
    after = [tuple(s[0].clone() for s in plain)]
    for row in (b[66], b[67]):
        expected.append(_step(layer, plain, [(0, row)], []))
        after.append(tuple(s[0].clone() for s in plain))
    # Rows in chunk order: slot 0's three, then slot 3's; by position: 0, 3 | 1 | 2.
    verify = VerifyRows(
        offsets=(0, 2, 3, 4),
        rows=torch.tensor([0, 3, 1, 2]),
        src_slots=_i32([0, 3, 1, 2]),
        dst_slots=_i32([1, 3, 2, 0]),
    )
    meta = GatedDeltaMeta(
        num_decodes=4, decode_slots=_i32([0, 3]), prefill_cu_seqlens=_i32([0]),
        prefill_slots=_i32([]), prefill_has_initial_state=torch.zeros(0, dtype=torch.bool),
        verify=verify,
    )  # fmt: skip
    with torch.no_grad():
        got = layer(torch.stack([b[65], b[66], b[67], a[3]]), meta, *states)
    close = {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(got[[0, 3]], expected[0], **close)
    torch.testing.assert_close(got[1:3], torch.cat(expected[1:]), **close)
    for i, (conv, ssm) in enumerate(after):
        slot = (1, 2, 0)[i]  # the state after i + 1 tokens
        torch.testing.assert_close(states[0][slot], conv, **close)
        torch.testing.assert_close(states[1][slot], ssm, **close)
    torch.testing.assert_close(states[0][3], plain[0][3], **close)
    torch.testing.assert_close(states[1][3], plain[1][3], **close)
