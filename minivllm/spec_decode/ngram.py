"""N-gram (prompt lookup) proposer: find the request's last n tokens earlier in its prompt +
output and propose what followed them. No model: a per-request index of the history's n-grams,
grown by the tokens each step adds, so a step costs what it adds, not what the history holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from minivllm.spec_decode.config import SpeculativeConfig
from minivllm.spec_decode.proposer import DraftTokens, ProposeInput


class NgramProposer:
    """vLLM's n-gram proposer: the longest n in [prompt_lookup_min, prompt_lookup_max] whose
    last-n-token suffix occurs earlier in the history wins; among occurrences of that n the
    earliest is taken (as vLLM does); the up-to-k tokens after it are the drafts, fewer when
    the history ends first. Occurrences may overlap the suffix itself. Keeps an NgramIndex per
    request id (rows without ids get a throwaway one), released by remove_requests."""

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
        self._indexes: dict[str, NgramIndex] = {}

    @classmethod
    def from_config(cls, config: SpeculativeConfig) -> NgramProposer:
        return cls(
            config.num_speculative_tokens, config.prompt_lookup_max, config.prompt_lookup_min
        )

    def propose(self, batch: ProposeInput) -> DraftTokens:
        out = DraftTokens.empty(batch.num_requests, self.num_speculative_tokens)
        for i, (history, cap) in enumerate(
            zip(batch.token_ids, batch.caps(self.num_speculative_tokens), strict=True)
        ):
            if cap <= 0:
                continue
            req_id = batch.req_ids[i] if batch.req_ids else None
            row = self._index_of(req_id, history).propose(history, cap)
            out.token_ids[i, : len(row)] = row
            out.num_draft_tokens[i] = len(row)
        return out

    def remove_requests(self, req_ids: Sequence[str]) -> None:
        for req_id in req_ids:
            self._indexes.pop(req_id, None)

    def _index_of(self, req_id: str | None, history: Sequence[int]) -> NgramIndex:
        """req_id's index (a fresh one for a new request, for rows without an id, and for a
        history shorter than what was indexed: not the same history any more)."""
        index = self._indexes.get(req_id) if req_id is not None else None
        if index is None or index.num_indexed > len(history):
            index = NgramIndex(self.prompt_lookup_min, self.prompt_lookup_max)
            if req_id is not None:
                self._indexes[req_id] = index
        return index


class NgramIndex:
    """The n-grams (n in [min_n, max_n]) of one growing history, each with the end of its
    earliest occurrence: first_end[n][ngram] = e where history[e - n : e] == ngram, for the
    occurrences that end before the history's last token (ends up to num_indexed)."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.sizes = range(min_n, max_n + 1)
        self.first_end: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self.num_indexed = 0

    def propose(self, history: Sequence[int], cap: int) -> list[int]:
        """Up to cap tokens that followed the earliest earlier occurrence of the longest suffix
        of history (n from max_n down to min_n) that occurs earlier, fewer where the history
        ends first; [] when none does."""
        length = len(history)
        self._extend(history, length - 1)  # an occurrence ends before the last token
        for n in reversed(self.sizes):
            if n >= length:
                continue
            end = self.first_end[n].get(tuple(history[length - n :]))
            if end is not None:
                return list(history[end : min(end + cap, length)])
        return []

    def _extend(self, history: Sequence[int], upto: int) -> None:
        """Indexes the occurrences ending at num_indexed + 1 .. upto."""
        start = self.num_indexed + 1
        if upto < start:
            return
        for n, first_end in self.first_end.items():
            lo = max(start, n)
            if lo > upto:
                continue
            if not first_end:
                # First build: the n-gram tuples and the dict in C. Fed latest first, the
                # dict keeps each n-gram's earliest end.
                grams = zip(*(history[lo - n + j : upto - n + j + 1] for j in range(n)))
                first_end.update(zip(reversed(list(grams)), range(upto, lo - 1, -1)))
            else:
                for end in range(lo, upto + 1):
                    first_end.setdefault(tuple(history[end - n : end]), end)
        self.num_indexed = upto
