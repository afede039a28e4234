"""Prompt logprobs: which hidden rows of a step score prompt tokens, and their LogprobsDicts.

The row of position p predicts the token at p + 1, so a chunk covering prompt positions
[start, end) scores prompt tokens start + 1 .. end (the last prompt row predicts the first
output token and belongs to sampling, not here).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minivllm.engine.runner.sampling_state import SamplingState, prompt_logprobs_for
from minivllm.engine.types import SchedulerOutput
from minivllm.outputs import LogprobsDict


@dataclass
class PromptLogprobsJob:
    req_id: str
    rows: np.ndarray  # [P] row indices into the step's hidden states
    next_token_ids: list[int]  # [P] the prompt tokens those rows score
    num_logprobs: int
    is_first: bool  # the chunk starts at position 0: the first prompt token gets None


class PromptLogprobsTracker:
    """Plans each step's prompt-logprob rows; remembers how far each request got, so that a
    request recomputed after preemption does not report its prompt twice."""

    def __init__(self) -> None:
        self.num_done: dict[str, int] = {}

    def forget(self, req_ids: list[str]) -> None:
        """Drops finished requests (every step, empty ones too: a reused id starts over)."""
        for req_id in req_ids:
            self.num_done.pop(req_id, None)

    def plan(
        self, sched_out: SchedulerOutput, query_start_loc: np.ndarray, state: SamplingState
    ) -> list[PromptLogprobsJob]:
        jobs = []
        for i, chunk in enumerate(sched_out.chunks):
            request = state.requests.get(chunk.req_id)
            if request is None or request.params.prompt_logprobs is None:
                continue
            prompt = request.prompt_token_ids
            start = max(chunk.num_computed_tokens, self.num_done.get(chunk.req_id, 0))
            end = min(chunk.context_end, len(prompt) - 1)
            if end <= start and not (start == 0 and chunk.req_id not in self.num_done):
                continue
            offset = int(query_start_loc[i]) - chunk.num_computed_tokens
            jobs.append(
                PromptLogprobsJob(
                    chunk.req_id,
                    np.arange(start, max(start, end), dtype=np.int64) + offset,
                    prompt[start + 1 : end + 1],
                    request.params.prompt_logprobs,
                    is_first=chunk.req_id not in self.num_done,
                )
            )
            self.num_done[chunk.req_id] = max(start, end)
        return jobs

    @staticmethod
    def collect(
        jobs: list[PromptLogprobsJob], logits: torch.Tensor
    ) -> dict[str, list[LogprobsDict | None]]:
        """logits: [sum of job rows, vocab], the jobs' rows in order."""
        result: dict[str, list[LogprobsDict | None]] = {}
        offset = 0
        for job in jobs:
            n = len(job.rows)
            entries: list[LogprobsDict | None] = [None] if job.is_first else []
            if n:
                entries += prompt_logprobs_for(
                    logits[offset : offset + n], job.next_token_ids, job.num_logprobs
                )
            result[job.req_id] = entries
            offset += n
        return result
