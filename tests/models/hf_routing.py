"""The routed experts' oracle (enable_return_routed_experts): HF's router logits over a
completion's whole sequence, teacher-forced."""

from __future__ import annotations

import numpy as np
import torch

# Router logits this close are a tie: either expert is HF's choice (float32 on the CPU).
TIE_TOL = 1e-4


@torch.no_grad()
def assert_routing_matches_hf(
    hf_model, prompts: list[list[int]], completions: list, tie_tol: float = TIE_TOL
) -> None:
    """Each completion's routed_experts: one row per token but the last, and in every row
    and sparse layer the experts of HF's top-k router logits, in HF's order (up to ties:
    logits within tie_tol)."""
    for prompt, completion in zip(prompts, completions, strict=True):
        tokens = prompt + list(completion.token_ids)
        ours = completion.routed_experts
        out = hf_model(torch.tensor([tokens[:-1]]), output_router_logits=True)
        top_k = hf_model.config.num_experts_per_tok
        assert isinstance(ours, np.ndarray) and ours.dtype == np.uint8
        assert ours.shape == (len(tokens) - 1, len(out.router_logits), top_k)
        for layer, logits in enumerate(out.router_logits):  # [tokens - 1, experts]
            ids = torch.from_numpy(ours[:, layer].astype(np.int64))
            picked = logits.float().gather(1, ids)
            torch.testing.assert_close(
                picked, logits.float().topk(top_k).values, atol=tie_tol, rtol=0
            )
