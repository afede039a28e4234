"""The drafts of the scheduler's steps: which drafts each running request's chunk carries (the
speculator's proposals or slots, or its grammar's forced tokens: jump-forward), the drafts a
step asks the runner for, and what a step's drafts turned out to be. Who may draft, how many
and the back-off are the Speculator's (speculation.py); the proposers run in the runner."""

from __future__ import annotations

from minivllm.engine.sched.kv.block_manager import BlockManager
from minivllm.engine.sched.kv.kv_coordinator import HybridKVCoordinator
from minivllm.engine.sched.request import Request, RequestStatus
from minivllm.engine.sched.speculation import Speculator
from minivllm.engine.types import LogprobsDict, RunnerOutput, ScheduledChunk


class Drafting:
    """A scheduler's drafts, speculative (speculator: None where off) and forced."""

    def __init__(
        self, speculator: Speculator | None, block_manager: BlockManager | HybridKVCoordinator
    ) -> None:
        self.speculator = speculator
        self.block_manager = block_manager
        self.active = False  # whether this step's batch size lets requests draft
        # Requests whose drafts in flight are their grammar's forced tokens (a request has at
        # most one chunk with drafts in flight: under async scheduling, until the update() of
        # its step, which may come after the next schedule()).
        self.forced_req_ids: set[str] = set()

    def proposed_drafts(self, running: list[Request], num_requests: int) -> dict[str, list[int]]:
        """req_id -> the drafts each running request uses this step: the runner's proposals
        after the last step, as the speculator allows them at num_requests running or
        waiting (a grammar's forced tokens are the scheduler's to add)."""
        speculator = self.speculator
        if speculator is None:
            return {}
        self.active = speculator.is_active(num_requests)
        if not self.active:
            return {}
        drafts = {}
        for request in running:
            draft = speculator.take_drafts(request) or speculator.take_slots(request)
            if draft:
                drafts[request.req_id] = draft
        return drafts

    def ask(self, request: Request, chunk: ScheduledChunk) -> None:
        """Asks the runner for request's next drafts after its sampling chunk (draft_cap);
        called where this step's batch size lets requests draft (active), before the chunk's
        token counts as pending."""
        assert self.speculator is not None
        chunk.draft_cap = self.speculator.ask(request)

    def receive(self, request: Request, chunk: ScheduledChunk, runner_out: RunnerOutput) -> None:
        """The drafts the runner proposed after chunk, which asked for them (its tokens are
        appended, the request unfinished)."""
        assert self.speculator is not None
        self.speculator.receive(request, runner_out.draft_token_ids.get(chunk.req_id, []))

    def accept(
        self,
        request: Request,
        chunk: ScheduledChunk,
        runner_out: RunnerOutput,
        i: int,
        token_ids: list[int],
        logprobs: list[LogprobsDict] | None,
    ) -> tuple[list[int], list[LogprobsDict] | None, int, int]:
        """The new tokens (and logprobs) of sampled chunk i, which had draft slots: the
        accepted drafts, then the target's own token; and its speculative drafts and accepted
        drafts as counted (0, 0 for a grammar's forced tokens). The slots past the accepted
        drafts are taken back (the runner may have filled fewer than the chunk had: its
        proposer found fewer), and their KV blocks given back."""
        num_slots = chunk.num_draft_tokens
        request.num_pending_drafts -= num_slots
        num_drafts, accepted = 0, []
        if runner_out.num_draft_tokens is not None:
            num_drafts = runner_out.num_draft_tokens[i]
            accepted = runner_out.accepted_draft_ids[i]
        num_accepted = len(accepted)
        speculative = request.req_id not in self.forced_req_ids
        self.forced_req_ids.discard(request.req_id)
        if self.speculator is not None and speculative and num_drafts:
            self.speculator.observe(request, num_drafts, num_accepted)
        if logprobs is not None and num_accepted:
            assert runner_out.draft_logprobs is not None
            logprobs = runner_out.draft_logprobs[i][:num_accepted] + logprobs
        # KV is valid through the last accepted draft; the target's token is computed next.
        # (Preempted while the step ran, it has no KV left: it is recomputed.) A step
        # scheduled meanwhile went on from where all the slots would be accepted: the runner
        # moved it back as far (runner/drafts/draft_slots.py).
        if request.status == RequestStatus.RUNNING:
            request.num_computed_tokens -= num_slots - num_accepted
            self.block_manager.trim(request, request.num_computed_tokens + 1)
        counted = (num_drafts, num_accepted) if speculative else (0, 0)
        return accepted + token_ids, logprobs, *counted

    def forget(self, req_id: str) -> None:
        """The request finished."""
        self.forced_req_ids.discard(req_id)
        if self.speculator is not None:
            self.speculator.forget(req_id)
