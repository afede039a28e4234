"""What the gated delta kernels share: loading a tile of q/k rows (L2-normalized on the way)."""

from __future__ import annotations

import triton
import triton.language as tl

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
