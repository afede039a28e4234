"""The gated delta rule's one-token step for decode, batched over requests: each request's
float32 state [d_k, d_v] per value head is read and written in place at its slot. Torch
definition: `layers/gated_delta.py` (`gated_delta_rule_decode`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_same, check_tensor
from minivllm.kernels.gated_delta.common import L2NORM_EPS, check_rule_inputs


@triton.jit(do_not_specialize_on_alignment=["slots_ptr", "dst_slots_ptr", "rows_ptr"])
def _recurrent_step_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, slots_ptr, dst_slots_ptr, rows_ptr, out_ptr,
    scale,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_gt, stride_bt,
    stride_ss, stride_sh, stride_ot, stride_oh,
    HEADS_PER_K: tl.constexpr, D_K: tl.constexpr, D_V: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, L2NORM: tl.constexpr, HAS_ROWS: tl.constexpr,
):  # fmt: skip
    """Grid (num_requests, H_v, cdiv(d_v, BV)): one request's value head, BV columns of its
    state held as a [BK, BV] float32 tile, read at its slot and written at its dst slot; its
    token is row i of the inputs and output, or row rows[i] (HAS_ROWS). A slot < 0 (padded
    row) writes a zero output."""
    i = tl.program_id(0).to(tl.int64)
    if HAS_ROWS:
        row = tl.load(rows_ptr + i).to(tl.int64)
    else:
        row = i
    head = tl.program_id(1)
    cols_v = tl.program_id(2) * BV + tl.arange(0, BV)
    cols_k = tl.arange(0, BK)
    slot = tl.load(slots_ptr + i).to(tl.int64)
    # A scalar bool cannot mask a vector in the interpreter: padded rows get no columns.
    vmask = cols_v < tl.where(slot >= 0, D_V, 0)
    kmask = cols_k < D_K
    head_k = head // HEADS_PER_K
    q = tl.load(q_ptr + row * stride_qt + head_k * stride_qh + cols_k, mask=kmask, other=0.0)
    k = tl.load(k_ptr + row * stride_kt + head_k * stride_kh + cols_k, mask=kmask, other=0.0)
    q, k = q.to(tl.float32), k.to(tl.float32)
    if L2NORM:
        q *= tl.rsqrt(tl.sum(q * q, 0) + L2NORM_EPS)
        k *= tl.rsqrt(tl.sum(k * k, 0) + L2NORM_EPS)
    q *= scale
    v = tl.load(v_ptr + row * stride_vt + head * stride_vh + cols_v, mask=vmask, other=0.0)
    g = tl.load(g_ptr + row * stride_gt + head).to(tl.float32)
    beta = tl.load(beta_ptr + row * stride_bt + head).to(tl.float32)
    dst = tl.load(dst_slots_ptr + i).to(tl.int64)
    tile = head * stride_sh + cols_k[:, None] * D_V + cols_v[None, :]
    s_offs = tl.maximum(slot, 0) * stride_ss + tile
    s_mask = kmask[:, None] & vmask[None, :]
    s = tl.load(state_ptr + s_offs, mask=s_mask, other=0.0) * tl.exp(g)
    # The delta rule: write beta times what the decayed state mispredicts for v.
    delta = (v.to(tl.float32) - tl.sum(s * k[:, None], 0)) * beta
    s += k[:, None] * delta[None, :]
    tl.store(state_ptr + tl.maximum(dst, 0) * stride_ss + tile, s, mask=s_mask)
    o = tl.sum(s * q[:, None], 0)
    tl.store(out_ptr + row * stride_ot + head * stride_oh + cols_v,
             o.to(out_ptr.dtype.element_ty), mask=cols_v < D_V)  # fmt: skip


def gated_delta_rule_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_slots: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    dst_slots: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per request. q, k: [N, H_k, d_k]; v: [N, H_v, d_v]; g (log decay), beta:
    [N, H_v]; state: [num_slots, H_v, d_k, d_v] float32, read at state_slots [N] (< 0: a
    padded row, output zeros) and written at dst_slots [N] (None: in place). scale defaults
    to d_k ** -0.5. With rows [R] (int64), request i's token is row rows[i] of q, k, v, g,
    beta and of the output, and the slots are [R]. Returns the output [N, H_v, d_v] in
    v.dtype: out where given (only its rows written), else a new tensor."""
    check_rule_inputs(q, k, v, g, beta, state)
    num_requests = v.shape[0] if rows is None else rows.shape[0]
    check_tensor("state_slots", state_slots, 1, (torch.int32, torch.int64))
    check_same("state_slots", state_slots.shape[0], "num_requests", num_requests)
    if dst_slots is None:
        dst_slots = state_slots
    check_tensor("dst_slots", dst_slots, 1, (torch.int32, torch.int64))
    check_same("dst_slots", dst_slots.shape[0], "num_requests", num_requests)
    _, num_v_heads, d_v = v.shape
    d_k = q.shape[2]
    if out is None:
        out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    check_same("out.shape", tuple(out.shape), "v.shape", tuple(v.shape))
    if num_requests == 0:
        return out
    block_v = min(64, triton.next_power_of_2(d_v))
    grid = (num_requests, num_v_heads, triton.cdiv(d_v, block_v))
    _recurrent_step_kernel[grid](
        q, k, v, g, beta, state, state_slots, dst_slots, state_slots if rows is None else rows,
        out, d_k**-0.5 if scale is None else scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g.stride(0), beta.stride(0), state.stride(0), state.stride(1), out.stride(0),
        out.stride(1),
        HEADS_PER_K=num_v_heads // q.shape[1], D_K=d_k, D_V=d_v,
        BK=triton.next_power_of_2(d_k), BV=block_v, L2NORM=use_qk_l2norm,
        HAS_ROWS=rows is not None, num_warps=4,
    )  # fmt: skip
    return out
