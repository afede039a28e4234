"""Drafter: the runner's side of speculative decoding. After a step's tokens are read, its
proposer (n-gram, or the draft model of runner/drafts/draft_model.py) drafts the next step's tokens
for the chunks the scheduler asked (ScheduledChunk.draft_cap); they go back as plain data in
RunnerOutput.draft_token_ids. The scheduler decides who drafts and how many it uses
(engine/sched/speculation.py); the drafter only proposes.

It keeps each live request's token history on the host (the prompt, then every token its
steps add), which the proposers read.
"""

from __future__ import annotations

from collections.abc import Sequence

from minivllm.engine.types import SchedulerOutput
from minivllm.spec_decode.proposer import ProposeInput, Proposer


class Drafter:
    """A proposer and the token histories it drafts from (rank 0's runner only)."""

    def __init__(self, proposer: Proposer) -> None:
        self.proposer = proposer
        self._histories: dict[str, list[int]] = {}

    def update(self, sched_out: SchedulerOutput) -> None:
        """Forgets the step's finished requests and starts the new ones' histories."""
        finished = sched_out.finished_req_ids
        if finished:
            for req_id in finished:
                self._histories.pop(req_id, None)
            self.proposer.remove_requests(finished)
        for new in sched_out.new_requests:
            self._histories[new.req_id] = list(new.prompt_token_ids)

    @staticmethod
    def asked(sched_out: SchedulerOutput) -> list[tuple[str, int]]:
        """(req_id, draft_cap) of the step's chunks that ask for drafts."""
        return [(c.req_id, c.draft_cap) for c in sched_out.chunks if c.draft_cap]

    def append(self, req_id: str, token_ids: Sequence[int]) -> None:
        """A step's new tokens of req_id; a request forgotten meanwhile (async scheduling: it
        ended while its step was in flight) is skipped."""
        history = self._histories.get(req_id)
        if history is not None:
            history += token_ids

    def append_sampled(self, req_ids: list[str], token_ids: list[int]) -> None:
        """A plain step's tokens, one per request (append, batched: this runs every step)."""
        histories = self._histories
        for req_id, token_id in zip(req_ids, token_ids, strict=True):
            history = histories.get(req_id)
            if history is not None:
                history.append(token_id)

    def propose(self, asked: list[tuple[str, int]]) -> dict[str, list[int]]:
        """req_id -> up to cap drafts after its history, for each asked request still live."""
        rows = [(req_id, cap) for req_id, cap in asked if req_id in self._histories]
        if not rows:
            return {}
        batch = ProposeInput.from_lists(
            [self._histories[req_id] for req_id, _ in rows],
            [cap for _, cap in rows],
            [req_id for req_id, _ in rows],
        )
        drafts = self.proposer.propose(batch).to_lists()
        return {req_id: d for (req_id, _), d in zip(rows, drafts, strict=True)}
