"""PoolingParams: what a pooling request asks of the engine, as plain data.

A pooling request is prefill-only: it rides in SamplingParams.pooling, is scheduled like any
prompt, and its output is the vector (or score) its last prompt chunk gives, not a token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PoolingType = Literal["last", "mean", "cls"]
PoolingTask = Literal["embed", "score"]
POOLING_TYPES = ("last", "mean", "cls")


@dataclass(frozen=True)
class PoolingParams:
    """task "embed": the hidden states pooled by pooling_type, cut to the first dimensions
    (Matryoshka; None: all), then L2-normalised where normalize. task "score": the last
    prompt position's logits of score_token_ids = (false_id, true_id), as
    sigmoid(logit[true] - logit[false]) (a yes/no reranker's probability of "yes")."""

    task: PoolingTask = "embed"
    pooling_type: PoolingType = "last"
    normalize: bool = True
    dimensions: int | None = None
    score_token_ids: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.task not in ("embed", "score"):
            raise ValueError(f"task must be 'embed' or 'score', got {self.task!r}")
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(
                f"pooling_type must be one of {POOLING_TYPES}, got {self.pooling_type!r}"
            )
        if self.dimensions is not None and (
            isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int)
            or self.dimensions < 1
        ):  # fmt: skip
            raise ValueError(f"dimensions must be a positive integer, got {self.dimensions!r}")
        if (self.task == "score") != (self.score_token_ids is not None):
            raise ValueError("score_token_ids go with task 'score', and only with it")
        if self.task == "score" and self.pooling_type != "last":
            raise ValueError("a score reads the last prompt position: pooling_type must be 'last'")

    @property
    def needs_all_rows(self) -> bool:
        """Whether every prompt position's hidden state is read (mean, cls): such a request
        computes its whole prompt (no prefix-cache hit skips its first positions)."""
        return self.pooling_type != "last"
