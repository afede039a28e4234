"""Gated DeltaNet under tensor parallelism, each rank simulated in one process (its all-reduce
left to the test): every rank loads its heads' slices of the full layer's checkpoint tensors
(q/k by key head, v/z/b/a, A_log, dt_bias by value head, the conv channels to match), keeps
its heads' recurrent states, and the ranks' out-projection partials sum to the full layer's
output, through a packed prefill (one sequence resumed from a state) and a decode step. The
stacked in_proj_qkv of a block-FP8 checkpoint splits its scales with its rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minivllm.layers import gated_delta_net as gdn_module
from minivllm.layers import linear as linear_module
from minivllm.layers.gated_delta_net import GatedDeltaMeta, GatedDeltaNet
from minivllm.layers.linear import MergedColumnParallelLinear, default_weight_loader
from minivllm.layers.ops import LayerOps
from minivllm.layers.quantization.build import quantized_ops
from minivllm.layers.quantization.config import QuantConfig
from minivllm.layers.quantization.fp8_math import dequantize_token_groups, quantize_token_groups
from tests.fp8_checkpoint import block_dequantize, block_quantize

HIDDEN, H_K, H_V, D_K, D_V, KERNEL = 32, 2, 4, 16, 16, 4  # the kernels take 16-256 dims
NUM_SLOTS = 3
FP8_OPS = quantized_ops(LayerOps(), QuantConfig("fp8"))


def on_rank(monkeypatch: pytest.MonkeyPatch, rank: int, tp_size: int, make):
    for module in (linear_module, gdn_module):
        monkeypatch.setattr(module, "get_tp_rank_size", lambda: (rank, tp_size))
    return make()


def make_layer(use_triton: bool = False) -> GatedDeltaNet:
    ops = LayerOps(row_reduce=lambda x, n: x)  # the test sums the ranks' partials
    sizes = (HIDDEN, H_K, H_V, D_K, D_V, KERNEL, 1e-6, torch.float32)
    return GatedDeltaNet(*sizes, use_triton=use_triton, ops=ops)


def empty_states(layer: GatedDeltaNet) -> tuple[torch.Tensor, torch.Tensor]:
    conv = torch.zeros(NUM_SLOTS, KERNEL - 1, layer.conv_dim)
    ssm = torch.zeros(NUM_SLOTS, layer.num_v_heads, D_K, D_V)
    return conv, ssm


def run_steps(layer: GatedDeltaNet, states, x_prefill, x_decode) -> list[torch.Tensor]:
    """A prefill of two sequences (5 tokens into slot 0 from zeros, 9 into slot 2 from its
    state), then a decode row for each."""
    slots = torch.tensor([0, 2], dtype=torch.int32)
    prefill = GatedDeltaMeta(
        0, slots[:0], torch.tensor([0, 5, 14], dtype=torch.int32), slots,
        torch.tensor([0, 1], dtype=torch.int32),
    )  # fmt: skip
    decode = GatedDeltaMeta(2, slots, torch.zeros(1, dtype=torch.int32), slots[:0], slots[:0])
    with torch.no_grad():
        return [layer(x_prefill, prefill, *states), layer(x_decode, decode, *states)]


def head_slices(rank: int, tp_size: int) -> tuple[torch.Tensor, slice]:
    """Rank's conv channels (its q, k and v columns of the full layer's) and value heads."""
    key, value = H_K * D_K // tp_size, H_V * D_V // tp_size
    starts = (rank * key, H_K * D_K + rank * key, 2 * H_K * D_K + rank * value)
    channels = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, (key, key, value))])
    heads = H_V // tp_size
    return channels, slice(rank * heads, (rank + 1) * heads)


@pytest.mark.parametrize("use_triton", [False, True], ids=["torch", "triton"])
def test_heads_split_over_ranks_sum_to_the_full_layer(
    monkeypatch: pytest.MonkeyPatch, use_triton: bool
) -> None:
    """The whole layer in torch; each rank's with the torch definitions or the Triton kernels
    (in the interpreter on the CPU) on its one key head and two value heads."""
    torch.manual_seed(0)
    full = make_layer()
    with torch.no_grad():
        for param in full.parameters():
            param.normal_(0, 0.3)
    checkpoint = dict(full.state_dict())
    x_prefill, x_decode = torch.randn(14, HIDDEN), torch.randn(2, HIDDEN)
    full_states = empty_states(full)
    full_states[0][2].normal_()  # slot 2 resumes from a state
    full_states[1][2].normal_()
    start_states = tuple(s.clone() for s in full_states)
    expected = run_steps(full, full_states, x_prefill, x_decode)
    tp_size = 2
    totals = [torch.zeros_like(e) for e in expected]
    for rank in range(tp_size):
        layer = on_rank(monkeypatch, rank, tp_size, lambda: make_layer(use_triton))
        assert (layer.num_k_heads, layer.num_v_heads) == (H_K // tp_size, H_V // tp_size)
        for name, param in layer.named_parameters():
            getattr(param, "weight_loader", default_weight_loader)(param, checkpoint[name])
        channels, heads = head_slices(rank, tp_size)
        states = (start_states[0][..., channels].clone(), start_states[1][:, heads].clone())
        for total, out in zip(totals, run_steps(layer, states, x_prefill, x_decode)):
            total += out
        # The rank's states are the full layer's states of its heads.
        torch.testing.assert_close(states[0], full_states[0][..., channels])
        torch.testing.assert_close(states[1], full_states[1][:, heads])
    for total, out in zip(totals, expected, strict=True):
        torch.testing.assert_close(total, out, atol=1e-5, rtol=1e-5)


def w8a8(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The FP8 path's product: x rounded per token-group of 128, times the dequantized weight."""
    return F.linear(dequantize_token_groups(*quantize_token_groups(x)), weight)


def test_stacked_fp8_qkv_splits_its_scales_by_part(monkeypatch: pytest.MonkeyPatch) -> None:
    """in_proj_qkv stored whole (q, k: 256 rows each, v: 512) in block FP8: each rank takes
    its rows of every part and the scale rows of their blocks."""
    sizes, hidden = [256, 256, 512], 128
    torch.manual_seed(1)
    weight, scale = block_quantize(torch.randn(sum(sizes), hidden))
    dequantized = block_dequantize(weight, scale)
    x = torch.randn(3, hidden)
    for rank in range(2):
        layer = on_rank(
            monkeypatch, rank, 2, lambda: MergedColumnParallelLinear(hidden, sizes, ops=FP8_OPS)
        )
        layer.weight.weight_loader(layer.weight, weight)
        layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, scale)
        rows = torch.cat([torch.arange(s + rank * n // 2, s + (rank + 1) * n // 2)
                          for s, n in zip((0, 256, 512), sizes)])  # fmt: skip
        torch.testing.assert_close(layer(x), w8a8(x, dequantized[rows]), atol=1e-4, rtol=1e-5)
    with pytest.raises(ValueError, match="do not fall on its 128-row blocks"):
        odd = on_rank(
            monkeypatch,
            0,
            2,
            lambda: MergedColumnParallelLinear(hidden, [64, 64, 256], ops=FP8_OPS),
        )
        odd.weight_scale_inv.weight_loader(odd.weight_scale_inv, torch.ones(3, 1))
