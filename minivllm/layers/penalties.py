"""Repetition (prompt + output), frequency and presence (output) penalties, as vLLM applies
them, from per-request tables on the device (engine/runner/sampling/penalty_state.py keeps them).

The Triton kernel (kernels/penalties.py) on CUDA; this torch definition on the CPU, the same
arithmetic in the same order.
"""

from __future__ import annotations

import torch


def token_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N, L] int64 ids padded with -1 -> [N, vocab_size] int32 occurrence counts."""
    # Padding and out-of-vocab ids land in an extra dump column that is cut off.
    ids = torch.where((token_ids < 0) | (token_ids >= vocab_size), vocab_size, token_ids)
    counts = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.int32, device=ids.device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.int32))
    return counts[:, :vocab_size]


def token_mask(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N, L] int64 ids padded with -1 -> [N, vocab_size] bool, True where the id occurs."""
    return token_counts(token_ids, vocab_size) > 0


def penalize(
    logits: torch.Tensor,
    rows: torch.Tensor,
    slots: torch.Tensor,
    output_counts: torch.Tensor,
    prompt_mask: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    drafts: torch.Tensor | None = None,
) -> torch.Tensor:
    """The torch definition of kernels.penalties.apply_penalties_from_tables (same arguments):
    penalizes logits [N, V] float32 rows `rows` from table slots `slots`, in place."""
    vocab_size = logits.shape[1]
    width = min(output_counts.shape[1], vocab_size)
    counts = torch.zeros(rows.shape[0], vocab_size, dtype=torch.int32, device=logits.device)
    counts[:, :width] = output_counts[slots, :width]
    seen = torch.zeros(rows.shape[0], vocab_size, dtype=torch.bool, device=logits.device)
    seen[:, :width] = prompt_mask[slots, :width]
    if drafts is not None:
        counts += token_counts(drafts, vocab_size)
    output_mask = counts > 0
    seen |= output_mask
    x = logits[rows]  # [P, V]
    penalties = torch.where(seen, repetition[rows].unsqueeze(1), 1.0)
    x = torch.where(x > 0, x / penalties, x * penalties)
    x -= frequency[rows].unsqueeze(1) * counts
    x -= presence[rows].unsqueeze(1) * output_mask
    logits[rows] = x
    return logits
