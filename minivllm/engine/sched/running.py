"""The running batch's chunks each step: every running request gets the tokens it still needs
(a decode one, with drafts where they fit), in the batch's order; when KV blocks run out, the
last request is preempted by recompute (its blocks freed, back to the front of the waiting
queue)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from minivllm.engine.sched.chunks import add_chunk
from minivllm.engine.sched.drafting import Drafting
from minivllm.engine.sched.kv.block_manager import BlockManager
from minivllm.engine.sched.kv.kv_coordinator import HybridKVCoordinator
from minivllm.engine.sched.request import Request, RequestStatus
from minivllm.engine.types import ScheduledChunk


class RunningBatch:
    """The Scheduler's running requests (scheduler.py's Scheduler owns the state named here)."""

    max_num_seqs: int
    max_model_len: int
    block_manager: BlockManager | HybridKVCoordinator
    waiting: deque[Request]
    running: list[Request]
    drafting: Drafting
    num_preemptions: int
    _preempted_req_ids: list[str]
    _enqueue: Callable[..., None]

    def _schedule_running(
        self,
        budget: int,
        decodes: list[ScheduledChunk],
        others: list[ScheduledChunk],
        drafts: dict[str, list[int]],
        forced: dict[str, list[int]],
    ) -> tuple[int, bool]:
        """Schedules running requests in order, with drafts (req_id -> the drafts it may
        carry; forced: those that are a grammar's forced tokens); returns (budget left,
        whether any was preempted)."""
        preempted = False
        running = self.running
        allocate = self.block_manager.allocate_slots
        # Each draft is one more decode row (runner/drafts/draft_step.py); decode rows fit
        # max_num_seqs (and, on a hybrid model, each draft's recurrent state takes a draft slot).
        draft_rows = min(
            self.max_num_seqs - len(running), self.block_manager.num_free_draft_state_slots
        )
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            num_pending = request.num_pending_tokens
            if request.structured_output is None:  # its drafts in flight count as accepted
                num_pending += request.num_pending_drafts
            num_needed = len(request.all_token_ids) + num_pending - request.num_computed_tokens
            if num_needed <= 0 or (num_pending and self._finishes_with_pending(request)):
                # Nothing to compute until update() applies its pending token (fewer than
                # nothing: a constrained request's drafts are in flight, and their
                # acceptance decides).
                i += 1
                continue
            # A decode with drafts computes its last token and them (as many as fit).
            draft = drafts.get(request.req_id, [])[: min(budget - 1, draft_rows)]
            num_new_tokens = min(num_needed, budget)
            if num_new_tokens > 1:  # a prefill chunk ends where its state is snapshotted
                num_new_tokens = self.block_manager.clip_chunk(request, num_new_tokens)
            num_new_tokens += len(draft)
            if draft and (new_block_ids := allocate(request, num_new_tokens)) is None:
                draft, num_new_tokens = [], num_needed  # no room for drafts: decode plainly
            draft_rows -= len(draft)
            if draft and request.req_id in forced:
                self.drafting.forced_req_ids.add(request.req_id)
            while not draft and (new_block_ids := allocate(request, num_new_tokens)) is None:
                # Victims come from the tail, which nothing has been scheduled for this step.
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is request:
                    return budget, preempted
            add_chunk(request, num_new_tokens, new_block_ids, decodes, others, self.drafting, draft)
            budget -= num_new_tokens
            i += 1
        return budget, preempted

    def _preempt(self, request: Request) -> None:
        """Preemption by recompute: request's blocks are freed and it waits again, first."""
        self.block_manager.free(request)
        request.block_ids = []
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._preempted_req_ids.append(request.req_id)
        self._enqueue(self.waiting, request, first=True)

    def _finishes_with_pending(self, request: Request) -> bool:
        """Whether the pending token (the caller checked there is one) ends the request
        (max_tokens or max_model_len) where its drafts in flight are all accepted, so that
        scheduling another token for it would be wasted (or past max_model_len)."""
        max_tokens = request.sampling_params.max_tokens
        num_drafts = request.num_pending_drafts
        num_tokens = len(request.all_token_ids) + request.num_pending_tokens + num_drafts
        return num_tokens >= self.max_model_len or (
            max_tokens is not None and len(request.output_token_ids) + 1 + num_drafts >= max_tokens
        )
