"""The offline API's pooling results, shaped as vLLM's (LLM.embed, LLM.score)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class ScoringOutput:
    score: float


@dataclass
class EmbeddingRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True


@dataclass
class ScoringRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: ScoringOutput
    finished: bool = True
