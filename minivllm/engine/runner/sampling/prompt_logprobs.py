"""Prompt logprobs: which hidden rows of a step score prompt tokens, and their LogprobsDicts.

The row of position p predicts the token at p + 1, so a chunk covering prompt positions
[start, end) scores prompt tokens start + 1 .. end (the last prompt row predicts the first
output token and belongs to sampling, not here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from minivllm.engine.runner.sampling.logprob_packing import (
    pack_prompt_logprobs,
    prompt_logprob_dicts,
)
from minivllm.engine.runner.sampling.sampling_state import SamplingState
from minivllm.engine.types import SchedulerOutput
from minivllm.outputs import LogprobsDict

# Prompt rows scored at a time (at most max_num_seqs): the LM head's, log_softmax's and
# top-k's workspace is that of a sampling step of this many rows.
PROMPT_ROWS_PER_PASS = 256


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
    def score(
        jobs: list[PromptLogprobsJob],
        hidden: torch.Tensor,
        compute_logits: Callable[[torch.Tensor], torch.Tensor],
        rows_per_pass: int,
    ) -> list[torch.Tensor]:
        """Each job's prompt logprobs, packed on the device ([rows, 2(k+1)+1]: ids, logprobs,
        rank), from hidden [sum of job rows, hidden_size], the jobs' rows in order. The LM
        head, the log_softmax and the top-k run over at most rows_per_pass rows at a time: a
        long prompt's logprobs take the workspace of a sampling step of that many rows, not
        [prompt length, vocab] (rows_per_pass <= max_num_seqs keeps them within the memory
        profile's sampler workspace). Every TP rank runs it (the LM head gathers the vocab)."""
        packed, offset = [], 0
        for job in jobs:
            n = len(job.rows)
            next_ids = torch.as_tensor(job.next_token_ids, dtype=torch.int64)
            next_ids = next_ids.to(hidden.device, non_blocking=True)
            parts = [
                pack_prompt_logprobs(
                    compute_logits(hidden[offset + start : offset + min(n, start + rows_per_pass)]),
                    next_ids[start : start + rows_per_pass],
                    job.num_logprobs,
                )
                for start in range(0, n, rows_per_pass)
            ]
            packed.append(torch.cat(parts) if parts else hidden.new_empty(0, 0))
            offset += n
        return packed

    @staticmethod
    def collect(
        jobs: list[PromptLogprobsJob], packed: list[torch.Tensor]
    ) -> dict[str, list[LogprobsDict | None]]:
        """score()'s packed logprobs -> req_id -> one entry per prompt position computed (the
        first prompt token's: None)."""
        result: dict[str, list[LogprobsDict | None]] = {}
        for job, rows in zip(jobs, packed, strict=True):
            entries: list[LogprobsDict | None] = [None] if job.is_first else []
            if len(job.rows):
                entries += prompt_logprob_dicts(rows.tolist(), job.num_logprobs)
            result[job.req_id] = entries
        return result
