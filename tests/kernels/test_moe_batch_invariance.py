"""MoE in deterministic mode: a token's bits do not depend on the tokens beside it. The fused
kernels (the interpreter's dot replaced by a per-element ordered one, as a GPU MMA computes it:
ordered_dot.py) alone vs batched, with a batch that changes BLOCK_M and the blocks' make-up
(batch_invariant: a one-token step keeps the grouped GEMMs, not the small-step GEMVs).
The deterministic engine on the tiny Qwen3-MoE: test_batch_invariance_engine.py."""

from __future__ import annotations

import pytest
import torch
from ordered_dot import ordered_dot  # noqa: F401 (fixture)

from minivllm.kernels.moe.configs import MoeTileConfig, moe_config
from minivllm.kernels.moe.fused_moe import fused_moe
from minivllm.layers.moe_router import route

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on the CPU
E, H, INTER, TOP_K = 8, 64, 32, 2


@pytest.mark.usefixtures("ordered_dot")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_moe_rows_alone_equal_rows_batched(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, H, generator=g).to(dtype).to(DEVICE)
    w13 = (torch.randn(E, 2 * INTER, H, generator=g) * 0.1).to(dtype).to(DEVICE)
    w2 = (torch.randn(E, H, INTER, generator=g) * 0.1).to(dtype).to(DEVICE)
    topk_weights, topk_ids = route(torch.randn(40, E, generator=g).to(DEVICE), TOP_K, True)
    small = moe_config(dtype, (E, H, INTER, TOP_K), 1)
    large = MoeTileConfig(64, small.gate_up, small.down)  # a large step's BLOCK_M
    batched = fused_moe(x, w13, w2, topk_weights, topk_ids, large)
    for t in (0, 17, 39):
        rows = slice(t, t + 1)
        alone = fused_moe(x[rows], w13, w2, topk_weights[rows], topk_ids[rows],
                          batch_invariant=True)  # fmt: skip
        assert torch.equal(alone[0], batched[t])
