"""The tensor ops after pooling: Matryoshka truncation, L2 normalisation, a yes/no score."""

from __future__ import annotations

import torch


def truncate_normalize(
    pooled: torch.Tensor, dimensions: int | None, normalize: bool
) -> torch.Tensor:
    """pooled: [n, hidden] float32 -> [n, dimensions or hidden]: cut first, then normalised
    (as vLLM and OpenAI's API: a cut vector has unit length too)."""
    if dimensions is not None:
        pooled = pooled[:, :dimensions]
    if normalize:
        pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=-1)
    return pooled


def yes_no_scores(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """logits: [n, vocab]; token_ids: [n, 2] int64, (false id, true id) of each row.
    Returns [n] float32: softmax over the two logits, the true one's probability, which is
    sigmoid(logit[true] - logit[false]) (Qwen3-Reranker's score)."""
    pair = logits.float().gather(1, token_ids)
    return torch.sigmoid(pair[:, 1] - pair[:, 0])
