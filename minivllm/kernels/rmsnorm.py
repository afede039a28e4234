"""RMSNorm over the last dim, optionally fused with the residual add before it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_same, check_tensor


@triton.jit
def _rmsnorm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr, eps,
    stride_x, stride_res, stride_out, stride_new_res,
    HIDDEN: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):  # fmt: skip
    """Grid (num_tokens,): one program normalizes one row of HIDDEN elements."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < HIDDEN
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # The sum is rounded to the model dtype, as the unfused model does.
        x = (
            x.to(tl.float32) + tl.load(res_ptr + row * stride_res + offs, mask=mask).to(tl.float32)
        ).to(x.dtype)
        tl.store(new_res_ptr + row * stride_new_res + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, 0) / HIDDEN + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # HF order: normalize in fp32, cast to the input dtype, then scale by the weight.
    y = (xf * rstd).to(x.dtype).to(tl.float32) * w
    tl.store(out_ptr + row * stride_out + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns (weight * x / rms(x), None), or with residual [same shape as x]:
    (rms_norm(x + residual), x + residual). x: [num_tokens, hidden] (last dim contiguous),
    weight: [hidden]. Statistics in float32; outputs in x.dtype."""
    check_tensor("x", x, 2)
    check_tensor("weight", weight, 1)
    check_same("weight.shape[0]", weight.shape[0], "hidden", x.shape[1])
    if residual is not None:
        check_tensor("residual", residual, 2)
        check_same("residual.shape", tuple(residual.shape), "x.shape", tuple(x.shape))
        check_same("residual.dtype", residual.dtype, "x.dtype", x.dtype)
    num_tokens, hidden = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    new_res = None if residual is None else torch.empty_like(out)
    if num_tokens == 0:
        return out, new_res
    block = triton.next_power_of_2(hidden)
    res_or_x = x if residual is None else residual
    new_res_or_out = out if new_res is None else new_res
    _rmsnorm_kernel[(num_tokens,)](
        x, res_or_x, weight, out, new_res_or_out, eps,
        x.stride(0), res_or_x.stride(0), out.stride(0), new_res_or_out.stride(0),
        HIDDEN=hidden, BLOCK=block, HAS_RESIDUAL=residual is not None,
        num_warps=min(max(block // 256, 1), 16),
    )  # fmt: skip
    return out, new_res
