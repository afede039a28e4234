"""N-gram (prompt lookup) proposer: find the request's last n tokens earlier in its prompt +
output and propose what followed them. Batched over requests with numpy; no model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from minivllm.spec_decode.config import SpeculativeConfig
from minivllm.spec_decode.proposer import DraftTokens, ProposeInput


class NgramProposer:
    """vLLM's n-gram proposer: the longest n in [prompt_lookup_min, prompt_lookup_max] whose
    last-n-token suffix occurs earlier in the history wins; among occurrences of that n the
    earliest is taken (as vLLM does); the up-to-k tokens after it are the drafts, fewer when
    the history ends first. Occurrences may overlap the suffix itself."""

    def __init__(
        self, num_speculative_tokens: int, prompt_lookup_max: int, prompt_lookup_min: int
    ) -> None:
        if not 1 <= prompt_lookup_min <= prompt_lookup_max or num_speculative_tokens < 1:
            raise ValueError(
                "need 1 <= prompt_lookup_min <= prompt_lookup_max and num_speculative_tokens "
                f">= 1, got {prompt_lookup_min}, {prompt_lookup_max}, {num_speculative_tokens}"
            )
        self.num_speculative_tokens = num_speculative_tokens
        self.prompt_lookup_max = prompt_lookup_max
        self.prompt_lookup_min = prompt_lookup_min

    @classmethod
    def from_config(cls, config: SpeculativeConfig) -> NgramProposer:
        return cls(
            config.num_speculative_tokens, config.prompt_lookup_max, config.prompt_lookup_min
        )

    def propose(self, batch: ProposeInput) -> DraftTokens:
        k = self.num_speculative_tokens
        tokens, lengths = batch.token_ids, batch.num_tokens
        starts, _ = find_ngram_matches(
            tokens, lengths, self.prompt_lookup_min, self.prompt_lookup_max
        )
        # Drafts run from starts up to the end of the history, at most k (and the row's cap).
        num_draft = np.where(starts >= 0, np.minimum(lengths - starts, k), 0)
        if batch.max_num_draft_tokens is not None:
            num_draft = np.minimum(num_draft, np.maximum(batch.max_num_draft_tokens, 0))
        if tokens.shape[1] == 0:
            tokens = np.full((tokens.shape[0], 1), -1, np.int64)
        cols = np.minimum(starts[:, None] + np.arange(k), tokens.shape[1] - 1)  # [N, k]
        # Rows without a match read column -1 + j: masked below.
        drafts = np.take_along_axis(tokens, cols, axis=1)
        drafts = np.where(np.arange(k) < num_draft[:, None], drafts, -1)
        return DraftTokens(drafts.astype(np.int64), num_draft.astype(np.int64))

    def remove_requests(self, req_ids: Sequence[str]) -> None:
        """Stateless: nothing to forget."""


def find_ngram_matches(
    token_ids: np.ndarray, num_tokens: np.ndarray, min_n: int, max_n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per row: where the tokens after the best earlier match of its suffix start, and n.

    token_ids: [N, W] integer ids, row i's history in its first num_tokens[i] columns (ids >=
    0; padding < 0). Returns (starts [N] int64, n [N] int64): the match is token_ids[i,
    starts[i] - n[i] : starts[i]], equal to the row's last n[i] tokens, with n[i] in [min_n,
    max_n] as large as possible and then starts[i] as small as possible; starts[i] = -1 and
    n[i] = 0 when none. Cost: one dense pass over [N, W] for the last two tokens, then up to
    max_n - 2 checks per position that matches both.
    """
    num_rows, width = token_ids.shape
    starts = np.full(num_rows, -1, np.int64)
    best_n = np.zeros(num_rows, np.int64)
    lengths = num_tokens.astype(np.int64)
    if width < 2:
        return starts, best_n
    rows, ends, match_len = _pair_candidates(token_ids, lengths, max_n)
    keep = match_len >= min_n
    rows, ends, match_len = rows[keep], ends[keep], match_len[keep]
    # One key orders candidates by (longer n, then earlier end): the max per row is the match.
    key = match_len * width + (width - 1 - ends)
    best = np.full(num_rows, -1, np.int64)
    np.maximum.at(best, rows, key)
    found = best >= 0
    best_n[found] = best[found] // width
    starts[found] = width - best[found] % width
    if min_n == 1:
        _single_token_fallback(token_ids, lengths, ~found & (lengths >= 2), starts, best_n)
    return starts, best_n


def _pair_candidates(
    token_ids: np.ndarray, lengths: np.ndarray, max_n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every earlier end p (< L - 1) whose last two tokens equal the row's, with how many
    tokens (2..max_n) of the suffix match backwards from it: (rows, ends, lengths)."""
    empty = np.zeros(0, np.int64)
    num_rows, width = token_ids.shape
    if max_n < 2 or width < 3:
        return empty, empty, empty
    rows = np.arange(num_rows)
    # -2 is neither an id nor padding, so a row shorter than 2 matches nothing.
    last = np.where(lengths >= 2, token_ids[rows, np.maximum(lengths - 1, 0)], -2)
    prev = np.where(lengths >= 2, token_ids[rows, np.maximum(lengths - 2, 0)], -2)
    hits = token_ids[:, 1:-1] == last[:, None]
    hits &= token_ids[:, :-2] == prev[:, None]
    # flatnonzero + divmod: 2-D np.nonzero is ~15x slower on a sparse [N, W] mask.
    cand_rows, cand_ends = np.divmod(np.flatnonzero(hits), width - 2)
    cand_ends += 1
    # The suffix itself (end L - 1) is no earlier occurrence.
    earlier = cand_ends < lengths[cand_rows] - 1
    cand_rows, cand_ends = cand_rows[earlier], cand_ends[earlier]
    flat = np.ascontiguousarray(token_ids).reshape(-1)
    match_len = np.full(cand_rows.shape[0], 2, np.int64)
    alive = np.arange(cand_rows.shape[0])  # candidates still matching
    for j in range(2, max_n):
        alive = alive[cand_ends[alive] >= j]
        if alive.size == 0:
            break
        base = cand_rows[alive] * width
        # The suffix's token L - 1 - j lies after the candidate's p - j (p < L - 1).
        same = flat[base + cand_ends[alive] - j] == flat[base + lengths[cand_rows[alive]] - 1 - j]
        alive = alive[same]
        match_len[alive] += 1
    return cand_rows, cand_ends, match_len


def _single_token_fallback(
    token_ids: np.ndarray, lengths: np.ndarray, need: np.ndarray, starts: np.ndarray,
    best_n: np.ndarray,
) -> None:  # fmt: skip
    """For rows `need` (no match of 2+ tokens): the earliest earlier occurrence of the last
    token, written into starts and best_n (n = 1)."""
    rows = np.flatnonzero(need)
    if rows.size == 0:
        return
    last = token_ids[rows, lengths[rows] - 1]
    hits = token_ids[rows, :-1] == last[:, None]
    hits &= np.arange(token_ids.shape[1] - 1) < (lengths[rows] - 1)[:, None]
    first = hits.argmax(axis=1)
    ok = hits[np.arange(rows.size), first]
    starts[rows[ok]] = first[ok] + 1
    best_n[rows[ok]] = 1
