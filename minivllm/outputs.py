"""RequestOutput, CompletionOutput and Logprob, shaped like vLLM's."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)  # slots: a step builds hundreds (rows x k), half the cost to make
class Logprob:
    """vLLM's Logprob: log-probability of one token, its rank (1 = most likely), its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# {token_id: Logprob} for one position: the sampled (or prompt) token plus the top k.
LogprobsDict = dict[int, Logprob]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[LogprobsDict] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    # enable_return_routed_experts, once finished: [len(prompt) + len(token_ids) - 1, sparse
    # layers, top_k], the experts each forwarded token (all but the last) was routed to.
    # A streamed unfinished output has the rows so far (a view, read before the next step).
    routed_experts: np.ndarray | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_cached_tokens: int = 0
    # Speculative decoding: draft tokens proposed for the request (its n samples together)
    # and how many of them the target accepted.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: list[LogprobsDict | None] | None = None
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    # A pooling request's vector or [score] (SamplingParams.pooling), once finished.
    pooled: list[float] | None = None
