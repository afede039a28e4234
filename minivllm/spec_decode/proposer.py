"""The Proposer boundary: after a step, a proposer drafts up to k tokens per request from what
the engine has (token ids so far; a model-based proposer also gets the target's hidden states).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ProposeInput:
    """The requests to draft for, one row each (N rows).

    token_ids: row i's prompt + output so far, the request's own list (no copy: a proposer
    reads it during propose and neither changes nor keeps it). max_num_draft_tokens: [N]
    integers, a per-request cap on top of k (tokens left before max_tokens or max_model_len;
    0 = do not draft). target_hidden_states: for model-based proposers (EAGLE-style heads):
    the target's last hidden state of each row, [N, hidden]; None for ngram. req_ids: row ->
    request id, for proposers that keep per-request state.
    """

    token_ids: Sequence[Sequence[int]]
    req_ids: tuple[str, ...] = ()
    max_num_draft_tokens: np.ndarray | None = None
    target_hidden_states: torch.Tensor | None = None

    @classmethod
    def from_lists(
        cls,
        token_ids: Sequence[Sequence[int]],
        max_num_draft_tokens: Sequence[int] | None = None,
        req_ids: Sequence[str] = (),
    ) -> ProposeInput:
        caps = None
        if max_num_draft_tokens is not None:
            caps = np.asarray(max_num_draft_tokens, np.int64)
        return cls(tuple(token_ids), tuple(req_ids), max_num_draft_tokens=caps)

    @property
    def num_requests(self) -> int:
        return len(self.token_ids)

    def caps(self, k: int) -> list[int]:
        """Each row's number of drafts to propose at most: k, or its cap where lower."""
        if self.max_num_draft_tokens is None:
            return [k] * self.num_requests
        return [min(k, int(cap)) for cap in self.max_num_draft_tokens]


@dataclass(frozen=True)
class DraftTokens:
    """A proposer's output, plain data for the scheduler (N rows, k = num_speculative_tokens).

    token_ids: [N, k] int64 padded with -1; num_draft_tokens: [N] int64 (0..k: row i's drafts
    are token_ids[i, :num_draft_tokens[i]]). probs: [N, k, V] float32 on the device, the draft
    distribution q of each token, for rejection sampling; None when q is one-hot at the draft
    token (ngram: every proposal is certain).
    """

    token_ids: np.ndarray
    num_draft_tokens: np.ndarray
    probs: torch.Tensor | None = None

    @classmethod
    def empty(cls, num_rows: int, k: int) -> DraftTokens:
        """No drafts yet for num_rows rows of up to k (a proposer fills its rows in)."""
        return cls(np.full((num_rows, k), -1, np.int64), np.zeros(num_rows, np.int64))

    def to_lists(self) -> list[list[int]]:
        return [row[:n].tolist() for row, n in zip(self.token_ids, self.num_draft_tokens)]


class Proposer(Protocol):
    """Drafts tokens for a batch. A proposer may keep per-request state (ngram: an index of
    the history's n-grams; a draft model or an EAGLE head: its own KV cache), released by
    remove_requests. The engine's runner calls it after a step's tokens are read
    (engine/runner/drafts/drafter.py)."""

    num_speculative_tokens: int

    def propose(self, batch: ProposeInput) -> DraftTokens:
        """Up to num_speculative_tokens (and max_num_draft_tokens[i]) drafts per row."""
        ...

    def remove_requests(self, req_ids: Sequence[str]) -> None:
        """Forgets finished requests."""
        ...
