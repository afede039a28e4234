"""What the gated delta kernels share: the input checks of their launchers and loading a tile
of q/k rows (L2-normalized on the way)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_same, check_tensor

L2NORM_EPS = tl.constexpr(1e-6)  # HF's and FLA's eps: x / sqrt(sum(x^2) + eps)


@triton.jit
def load_rows(ptr, rows, row_mask, stride_t, cols, col_mask, L2NORM: tl.constexpr):
    """A [len(rows), len(cols)] float32 tile of one head's rows (ptr: the head's first
    element); masked entries are 0. L2NORM: each row divided by its L2 norm."""
    offs = rows.to(tl.int64)[:, None] * stride_t + cols[None, :]
    x = tl.load(ptr + offs, mask=row_mask[:, None] & col_mask[None, :], other=0.0)
    x = x.to(tl.float32)
    if L2NORM:
        x = x * tl.rsqrt(tl.sum(x * x, 1) + L2NORM_EPS)[:, None]
    return x


def check_rule_inputs(q, k, v, g, beta, state) -> None:
    """The shapes the gated delta kernels take: q, k [T, H_k, d_k]; v [T, H_v, d_v] (last
    dims contiguous); g, beta [T, H_v]; state [num_slots, H_v, d_k, d_v] float32 (each
    head's [d_k, d_v] contiguous)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, 3)
    for name, t in (("g", g), ("beta", beta)):
        check_tensor(name, t, 2)
    check_tensor("state", state, 4, (torch.float32,))
    check_same("k.shape", tuple(k.shape), "q.shape", tuple(q.shape))
    check_same("k.dtype", k.dtype, "q.dtype", q.dtype)
    check_same("v.dtype", v.dtype, "q.dtype", q.dtype)
    num_tokens, num_v_heads = v.shape[0], v.shape[1]
    check_same("q tokens", q.shape[0], "v tokens", num_tokens)
    for name, t in (("g", g), ("beta", beta)):
        check_same(f"{name}.shape", tuple(t.shape), "(tokens, H_v)", (num_tokens, num_v_heads))
    if num_v_heads % q.shape[1]:
        raise ValueError(f"H_v ({num_v_heads}) must be a multiple of H_k ({q.shape[1]})")
    expected = (num_v_heads, q.shape[2], v.shape[2])
    check_same("state.shape[1:]", tuple(state.shape[1:]), "(H_v, d_k, d_v)", expected)
    if state.stride(3) != 1 or state.stride(2) != v.shape[2]:
        raise ValueError(f"each state head must be contiguous, got strides {state.stride()}")
    for name, d in (("d_k", q.shape[2]), ("d_v", v.shape[2])):
        if not 16 <= d <= 256:
            raise ValueError(f"{name} must be in [16, 256], got {d}")
