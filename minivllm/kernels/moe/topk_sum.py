"""The per-token sum of the weighted expert outputs, over the top-k in order (k = 0, 1, ...),
in float32: a token's result does not depend on the batch or on the expert order."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_tensor


@triton.jit
def _topk_sum_kernel(y_ptr, out_ptr, H, stride_y, stride_out, TOP_K: tl.constexpr,
                     BLOCK: tl.constexpr):  # fmt: skip
    """Grid (num_tokens, cdiv(H, BLOCK)): out[t] = sum_k y[t * TOP_K + k], k ascending."""
    token = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < H
    acc = tl.zeros([BLOCK], tl.float32)
    for k in tl.static_range(TOP_K):
        row = y_ptr + (token * TOP_K + k) * stride_y
        acc += tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * stride_out + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def topk_sum(y: torch.Tensor, top_k: int) -> torch.Tensor:
    """y: [num_tokens * top_k, H] (row t * top_k + k: token t's k-th expert) -> [num_tokens, H]."""
    check_tensor("y", y, 2)
    if y.shape[0] % top_k:
        raise ValueError(f"y rows ({y.shape[0]}) must be a multiple of top_k ({top_k})")
    num_tokens, hidden = y.shape[0] // top_k, y.shape[1]
    out = torch.empty(num_tokens, hidden, dtype=y.dtype, device=y.device)
    if num_tokens == 0:
        return out
    block = min(1024, triton.next_power_of_2(hidden))
    grid = (num_tokens, triton.cdiv(hidden, block))
    _topk_sum_kernel[grid](
        y, out, hidden, y.stride(0), out.stride(0), TOP_K=top_k, BLOCK=block, num_warps=4
    )
    return out
