"""Top-k, top-p and min-p as one threshold a row: the smallest logit it keeps.

vLLM's semantics on logits / temperature: top-k keeps the k largest (ties with the k-th kept),
top-p then keeps the smallest most-likely set whose renormalized mass reaches p (the top
token always), min-p then drops tokens below min_p times the top probability. Each kept set
is every token at or above some value, so a row's filters come down to one threshold, found
among sorted candidates: the top max_top_k from torch.topk when every filtering row has a
top-k up to TOP_K_CAP (no vocabulary sort; a workspace of [N, max_top_k]), else a sort in
chunks of rows whose workspace stays under SORT_WORKSPACE_BYTES.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

# Top-k up to this many tokens filters over torch.topk candidates instead of a sort.
TOP_K_CAP = 1024
# The sort fallback sorts this many bytes of rows at a time (values, ids and their copies).
SORT_WORKSPACE_BYTES = 256 << 20
# Bytes a sorted row element takes in the fallback: float32 values, int64 ids, probabilities,
# cumulative sums and masks.
SORT_BYTES_PER_ELEMENT = 24


def can_filter_by_candidates(top_k: Sequence[int], top_p: Sequence[float]) -> bool:
    """Whether rows with these (random rows') top_k and top_p filter over topk candidates:
    every top_k within TOP_K_CAP, and every row with a top_p also with a top_k."""
    k, p = np.asarray(top_k), np.asarray(top_p)
    if k.shape != p.shape:
        raise ValueError(f"{len(k)} top_k values for {len(p)} top_p values")
    return bool(np.all((k <= TOP_K_CAP) & ((k > 0) | (p >= 1.0))))


def keep_thresholds(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    max_top_k: int,
    by_candidates: bool,
) -> torch.Tensor:
    """[N, 1] float32: each row keeps the logits >= its threshold (-inf: all).

    logits: [N, V] float32, penalized, not divided by temperature (the order is the same);
    temperature: [N] (0 is read as 1: greedy rows keep their argmax whatever the filters);
    top_k [N] int64 (0 = off), top_p [N] float32 (1 = off), min_p [N] float32 (0 = off), each
    None when no row uses it. by_candidates: can_filter_by_candidates held for the rows.
    """
    temperature = torch.where(temperature == 0.0, 1.0, temperature).unsqueeze(1)  # [N, 1]
    num_rows, vocab_size = logits.shape
    threshold = torch.full((num_rows, 1), -torch.inf, device=logits.device)
    if top_k is not None or top_p is not None:
        if by_candidates:
            k = min(max(max_top_k, 1), vocab_size)
            values = logits.topk(k, dim=-1).values  # [N, k], descending
            threshold = _sorted_thresholds(logits, values, temperature, top_k, top_p)
        else:
            threshold = _sort_in_chunks(logits, temperature, top_k, top_p)
    if min_p is not None:
        # p / p_max = exp((x - x_max) / T) >= min_p  <=>  x >= x_max + T * log(min_p).
        top = logits.amax(dim=-1, keepdim=True)
        threshold = torch.maximum(threshold, top + temperature * torch.log(min_p).unsqueeze(1))
    return threshold


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor
) -> torch.Tensor:
    """Top-k (when given), then top-p, on logits already divided by temperature: the dropped
    tokens set to -inf in place (the sort path, rows in chunks)."""
    ones = torch.ones(logits.shape[0], device=logits.device)
    threshold = _sort_in_chunks(logits, ones, top_k, top_p)
    return logits.masked_fill_(logits < threshold, -torch.inf)


def _sort_in_chunks(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
) -> torch.Tensor:
    """The thresholds from whole sorted rows, a bounded number of rows at a time."""
    temperature = temperature.reshape(-1, 1)
    num_rows, vocab_size = logits.shape
    step = max(1, SORT_WORKSPACE_BYTES // (SORT_BYTES_PER_ELEMENT * max(vocab_size, 1)))
    parts = []
    for start in range(0, num_rows, step):
        rows = slice(start, start + step)
        chunk = logits[rows]
        values = chunk.sort(dim=-1, descending=True).values
        parts.append(
            _sorted_thresholds(
                chunk,
                values,
                temperature[rows],
                None if top_k is None else top_k[rows],
                None if top_p is None else top_p[rows],
            )
        )
    return torch.cat(parts) if parts else torch.empty(0, 1, device=logits.device)


def _sorted_thresholds(
    logits: torch.Tensor,
    values: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
) -> torch.Tensor:
    """[N, 1] thresholds from values [N, K], the K largest logits of each row, descending.

    Rows whose top-k is off keep all for top-k and, when K < V, must have top_p off (the
    mass beyond the candidates is not known to them). Tokens tied with the k-th beyond the
    candidates are counted from logits (they are kept and share the renormalized mass).
    """
    num_candidates = values.shape[1]
    if top_k is None:
        kth = torch.full_like(values[:, :1], -torch.inf)
    else:
        index = top_k.clamp(1, num_candidates).sub(1).unsqueeze(1)
        kth = values.gather(1, index).masked_fill_((top_k == 0).unsqueeze(1), -torch.inf)
    if top_p is None:
        return kth
    scaled = values / temperature  # [N, K]
    in_top_k = values >= kth
    weights = torch.exp(scaled - scaled[:, :1]).masked_fill_(~in_top_k, 0.0)
    total = weights.sum(dim=-1, keepdim=True)
    if num_candidates < logits.shape[1]:
        # The k-th value's ties past the candidates: kept by top-k, part of the mass.
        beyond = (logits >= kth).sum(dim=-1, keepdim=True) - in_top_k.sum(dim=-1, keepdim=True)
        kth_weight = torch.exp(kth / temperature - scaled[:, :1]).nan_to_num_(0.0)
        total = total + beyond * kth_weight
    # A token stays while the more likely ones before it hold < top_p of the mass; rows with
    # top_p == 1 keep all (below), so that rounding cannot cut their tail. A top_p below
    # float32's smallest value arrives as 0: the top token stays all the same.
    mass_before = weights.cumsum(dim=-1) - weights
    keep = (mass_before < top_p.unsqueeze(1) * total) & in_top_k
    keep[:, 0] = True
    # The kept candidates are a prefix: the threshold is the last one's value (rows without
    # top-p: the k-th's, which keeps its ties past the candidates, or all).
    last = keep.sum(dim=-1, keepdim=True) - 1
    return torch.where((top_p >= 1.0).unsqueeze(1), kth, values.gather(1, last))
