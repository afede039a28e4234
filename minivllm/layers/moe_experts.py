"""The torch definition of a layer's experts: the CPU path and the fused kernels' reference
(`kernels/moe/fused_moe.py`). A loop over the experts in id order; each token's outputs are
summed over its top-k in order, in float32."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

Gemm = Callable[..., torch.Tensor]  # F.linear's contract: (x [M, K], w [N, K]) -> [M, N]


def experts_torch(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    gemm: Gemm = F.linear,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """x: [num_tokens, H]; w13: [E, 2I, H] (gate rows, then up rows); w2: [E, H, I];
    topk_weights: [num_tokens, top_k] float32; topk_ids: [num_tokens, top_k] in [0, E).
    Returns [num_tokens, H] in x.dtype. gemm: the layer's GEMM (deterministic mode's is
    batch-invariant). scales: block-FP8 experts, (w13's, w2's) per-expert block scales, and
    gemm is then the block-FP8 GEMM (x, wq, ws) (layers/quantization/fp8_math.py)."""

    def expert_gemm(a: torch.Tensor, w: torch.Tensor, which: int, expert: int) -> torch.Tensor:
        if scales is None:
            return gemm(a, w[expert])
        return gemm(a, w[expert], scales[which][expert])

    num_tokens, top_k = topk_ids.shape
    inter = w2.shape[2]
    flat_ids = topk_ids.reshape(-1)
    flat_weights = topk_weights.reshape(-1, 1).float()
    # per_pair row t * top_k + k: token t's k-th expert output, weighted, in x.dtype.
    per_pair = torch.zeros(num_tokens * top_k, x.shape[1], dtype=x.dtype, device=x.device)
    for expert in range(w13.shape[0]):
        pairs = (flat_ids == expert).nonzero().squeeze(1)
        if pairs.numel() == 0:
            continue
        gate_up = expert_gemm(x[pairs // top_k], w13, 0, expert)
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        out = expert_gemm(act, w2, 1, expert).float() * flat_weights[pairs]
        per_pair[pairs] = out.to(x.dtype)
    per_pair = per_pair.view(num_tokens, top_k, -1)
    total = torch.zeros(num_tokens, x.shape[1], dtype=torch.float32, device=x.device)
    for k in range(top_k):
        total += per_pair[:, k].float()
    return total.to(x.dtype)
