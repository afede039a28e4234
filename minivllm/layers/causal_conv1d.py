"""The causal depthwise conv1d of a Gated DeltaNet layer in torch, over packed sequences with a
conv state slot per request (the last width - 1 inputs): prefill and the one-token update. The
CPU path, and the oracle of the Triton kernels in `kernels/gated_delta/conv1d.py`."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _conv_rows(
    x_ext: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str | None
) -> torch.Tensor:
    """x_ext: [width - 1 + L, C] (the state rows, then the inputs) -> [L, C] float32."""
    out = F.conv1d(x_ext.float().t()[None], weight.float()[:, None, :], groups=weight.shape[0])
    out = out[0].t()
    if bias is not None:
        out = out + bias.float()
    return F.silu(out) if activation == "silu" else out


def _check_activation(activation: str | None) -> None:
    if activation not in (None, "silu"):
        raise ValueError(f"activation must be None or 'silu', got {activation!r}")


def causal_conv1d_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """x: [T, C] packed sequences (cu_seqlens [N + 1]); weight: [C, width]; bias: [C] or None;
    conv_state: [num_slots, width - 1, C], row j the input width - 1 - j tokens before the
    sequence's start: sequence i reads conv_state[state_slots[i]] where has_initial_state[i]
    (else zeros) and leaves its own last width - 1 inputs there (an empty sequence leaves it
    alone). Returns [T, C] in x.dtype."""
    _check_activation(activation)
    out = torch.empty_like(x)
    bounds = cu_seqlens.tolist()
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if start == end:
            continue  # an empty sequence leaves its state alone
        slot = int(state_slots[i])
        history = (
            conv_state[slot] if bool(has_initial_state[i]) else torch.zeros_like(conv_state[slot])
        )
        x_ext = torch.cat([history.to(x.dtype), x[start:end]])
        out[start:end] = _conv_rows(x_ext, weight, bias, activation).to(x.dtype)
        conv_state[slot] = x_ext[x_ext.shape[0] - conv_state.shape[1] :].to(conv_state.dtype)
    return out


def causal_conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    state_slots: torch.Tensor,
    activation: str | None = "silu",
    dst_slots: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per request. x: [N, C]; conv_state: [num_slots, width - 1, C], read at
    state_slots [N] and written at dst_slots [N] (None: in place, at state_slots); a slot < 0
    is a padded row (state untouched, output zeros). With rows [R], request i's token is row
    rows[i] of x and of the output (written into out where given, only at rows). Returns
    [N, C] in x.dtype."""
    if rows is not None:
        picked = causal_conv1d_update(
            x[rows], weight, bias, conv_state, state_slots, activation, dst_slots
        )
        out = torch.empty_like(x) if out is None else out
        out[rows] = picked
        return out
    _check_activation(activation)
    out = torch.zeros_like(x)
    rows = (state_slots >= 0).nonzero().flatten()
    slots = state_slots[rows].long()
    dst = slots if dst_slots is None else dst_slots[rows].long()
    x_ext = torch.cat([conv_state[slots].to(x.dtype), x[rows, None, :]], 1)  # [n, width, C]
    y = torch.einsum("nwc,cw->nc", x_ext.float(), weight.float())
    if bias is not None:
        y = y + bias.float()
    out[rows] = (F.silu(y) if activation == "silu" else y).to(x.dtype)
    conv_state[dst] = x_ext[:, 1:].to(conv_state.dtype)
    return out
