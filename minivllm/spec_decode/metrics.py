"""Speculative-decoding counters with vLLM's names (plain data): drafts, draft tokens, accepted
tokens, accepted tokens per draft position; observed per step, merged across steps or engines.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class SpecDecodingStats:
    """Counters since the last reset; exported as vllm:spec_decode_num_drafts,
    _num_draft_tokens, _num_accepted_tokens and _num_accepted_tokens_per_pos (label
    position)."""

    num_spec_tokens: int  # k: the length of num_accepted_tokens_per_pos
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # [k]: how many drafts had their token at position j accepted.
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens
        if len(self.num_accepted_tokens_per_pos) != self.num_spec_tokens:
            raise ValueError(
                f"num_accepted_tokens_per_pos has {len(self.num_accepted_tokens_per_pos)} "
                f"entries, num_spec_tokens is {self.num_spec_tokens}"
            )

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One request's draft of one step: num_draft_tokens proposed, the first
        num_accepted_tokens of them accepted. A request without drafts is no draft."""
        if not 0 <= num_accepted_tokens <= num_draft_tokens <= self.num_spec_tokens:
            raise ValueError(
                f"need 0 <= accepted ({num_accepted_tokens}) <= drafted ({num_draft_tokens}) "
                f"<= num_spec_tokens ({self.num_spec_tokens})"
            )
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for j in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[j] += 1

    def observe_step(self, num_draft_tokens: Iterable[int], num_accepted: Iterable[int]) -> None:
        """A step's rows (e.g. DraftTokens.num_draft_tokens, VerifyOutput.num_accepted)."""
        for drafted, accepted in zip(num_draft_tokens, num_accepted, strict=True):
            self.observe_draft(int(drafted), int(accepted))

    def merge(self, other: SpecDecodingStats) -> None:
        """Adds other's counts (another interval, another engine) into these."""
        if other.num_spec_tokens != self.num_spec_tokens:
            raise ValueError(
                f"cannot merge stats of k={other.num_spec_tokens} into k={self.num_spec_tokens}"
            )
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        self.num_accepted_tokens_per_pos = [
            a + b
            for a, b in zip(
                self.num_accepted_tokens_per_pos, other.num_accepted_tokens_per_pos, strict=True
            )
        ]


def acceptance_rate(stats: SpecDecodingStats) -> float:
    """Accepted / proposed draft tokens (0.0 before any draft)."""
    return stats.num_accepted_tokens / stats.num_draft_tokens if stats.num_draft_tokens else 0.0


def mean_acceptance_length(stats: SpecDecodingStats) -> float:
    """Tokens per drafted request step: 1 (the target's own token) + accepted per draft."""
    return 1.0 + stats.num_accepted_tokens / stats.num_drafts if stats.num_drafts else 1.0
