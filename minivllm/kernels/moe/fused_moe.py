"""The experts of one MoE layer in four launches: align the pairs by expert, the gate/up
grouped GEMM with SiLU-and-mul, the down grouped GEMM with the top-k weights, the per-token
sum. Same contract as the torch definition `layers/moe_experts.py` (`experts_torch`). Block-FP8
experts add two launches: x and the activation quantized per token-group of 128. A step of a
few pairs takes two GEMV launches instead (`gemv.py`; the rule: `configs.step_config`)."""

from __future__ import annotations

from dataclasses import replace

import torch

from minivllm.kernels.checks import FLOAT_DTYPES, check_same, check_tensor
from minivllm.kernels.fp8_gemm import quantize_token_groups
from minivllm.kernels.fp8_gemm_configs import BLOCK_K as FP8_BLOCK_K
from minivllm.kernels.moe.align import align_by_expert
from minivllm.kernels.moe.configs import MoeGemvConfig, MoeTileConfig, step_config
from minivllm.kernels.moe.gemv import moe_gemv
from minivllm.kernels.moe.grouped_gemm import grouped_gemm
from minivllm.kernels.moe.topk_sum import topk_sum


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: MoeTileConfig | MoeGemvConfig | None = None,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    batch_invariant: bool = False,
) -> torch.Tensor:
    """x: [num_tokens, H]; w13: [E, 2I, H] (each expert's gate rows, then its up rows);
    w2: [E, H, I]; topk_weights: [num_tokens, top_k] float32; topk_ids: [num_tokens, top_k]
    int32/int64 in [0, E). Returns [num_tokens, H] in x.dtype:
    sum over k of topk_weights[t, k] * w2[e] @ (silu(w13[e, :I] @ x[t]) * (w13[e, I:] @ x[t]))
    with e = topk_ids[t, k]. config: the path and tiles (default: `step_config` for the step;
    a MoeGemvConfig takes the GEMVs). w13_scale [E, 2I / 128, cdiv(H, 128)], w2_scale [E,
    cdiv(H, 128), I / 128] (float32): the weights are block FP8 (e4m3) and both GEMMs take
    block_k 128. batch_invariant: a token's bits do not depend on the step (deterministic
    mode): the default config is then always the grouped GEMMs'."""
    check_tensor("x", x, 2)
    weight_dtypes = (torch.float8_e4m3fn,) if w13_scale is not None else FLOAT_DTYPES
    check_tensor("w13", w13, 3, weight_dtypes)
    check_tensor("w2", w2, 3, weight_dtypes)
    check_tensor("topk_weights", topk_weights, 2, (torch.float32,))
    num_experts, hidden, inter = w2.shape
    check_same("w13 shape", tuple(w13.shape), "[E, 2I, H]", (num_experts, 2 * inter, hidden))
    check_same("x hidden", x.shape[1], "w2 hidden", hidden)
    check_same("topk_weights shape", tuple(topk_weights.shape), "topk_ids shape",
               tuple(topk_ids.shape))  # fmt: skip
    check_same("topk_ids rows", topk_ids.shape[0], "x rows", x.shape[0])
    num_tokens, top_k = topk_ids.shape
    fp8 = w13_scale is not None and w2_scale is not None
    if config is None:
        shape = (num_experts, hidden, inter, top_k)
        config = step_config(x.dtype, shape, num_tokens, fp8, batch_invariant)
    if isinstance(config, MoeGemvConfig):
        return moe_gemv(x, w13, w2, topk_weights, topk_ids, config,
                        (w13_scale, w2_scale) if fp8 else None)  # fmt: skip
    blocks = align_by_expert(topk_ids, num_experts, config.block_m)
    if fp8:
        return _fused_moe_fp8(x, w13, w2, w13_scale, w2_scale, topk_weights, config, blocks)
    # act, y: [num_tokens * top_k, I | H], row t * top_k + k for token t's k-th expert.
    act = grouped_gemm(x, w13, blocks, config.gate_up, rows_per_a=top_k, gated=True)
    y = grouped_gemm(act, w2, blocks, config.down, 1, False, topk_weights.reshape(-1))
    return topk_sum(y, top_k)


def _fused_moe_fp8(x, w13, w2, w13_scale, w2_scale, topk_weights, config, blocks):
    """fused_moe with block-FP8 weights: x and the activation quantized per token-group."""
    top_k = topk_weights.shape[1]
    gate_up = replace(config.gate_up, block_k=FP8_BLOCK_K)
    down = replace(config.down, block_k=FP8_BLOCK_K)
    xq, xs = quantize_token_groups(x)
    act = grouped_gemm(xq, w13, blocks, gate_up, top_k, True, None, (xs, w13_scale), x.dtype)
    aq, a_scale = quantize_token_groups(act)
    weights = topk_weights.reshape(-1)
    y = grouped_gemm(aq, w2, blocks, down, 1, False, weights, (a_scale, w2_scale), x.dtype)
    return topk_sum(y, top_k)
