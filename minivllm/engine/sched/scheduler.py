"""Scheduler: phase-free continuous batching with chunked prefill and preemption by recompute.

Each step gives every request the tokens it still needs (num_tokens - num_computed_tokens)
within a token budget and a seat limit; running requests first, then waiting ones (FIFO).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable

from minivllm.engine.sched.block_manager import BlockManager
from minivllm.engine.sched.grammar import (
    GrammarMasks,
    GrammarRows,
    advance_grammars,
    constrained_rows,
    end_grammar,
    fill_masks,
    first_admissible,
    forced_drafts,
    wait_for_compiles,
)
from minivllm.engine.sched.kv_coordinator import HybridKVCoordinator
from minivllm.engine.sched.request import Request, RequestStatus, needs_host_tokens
from minivllm.engine.sched.routed_experts import RoutedExpertsRecorder
from minivllm.engine.sched.speculation import Speculator
from minivllm.engine.sched.stop_checker import check_stop
from minivllm.engine.types import (
    PLACEHOLDER_TOKEN_ID,
    EngineOutput,
    GrammarOutput,
    LogprobsDict,
    NewRequestData,
    PendingRunnerOutput,
    RunnerOutput,
    ScheduledChunk,
    SchedulerOutput,
)


class Scheduler:
    """Decides which tokens of which requests each step computes, and applies the results.

    schedule() advances num_computed_tokens; a chunk that samples leaves one pending token.
    grammar_output() fills the step's grammar masks (while the device runs its forward).
    update() applies a step's sampled tokens. Synchronous use calls update() right after its
    schedule(); async scheduling calls schedule() for step N before update() of step N - 1,
    and the pending token enters step N as a placeholder the runner fills on the device.
    A finished request stays reachable through get_request until the next schedule().
    """

    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        block_manager: BlockManager | HybridKVCoordinator,
        structured_outputs: GrammarMasks | None = None,
        speculator: Speculator | None = None,
        policy: str = "fcfs",
        routed_experts: RoutedExpertsRecorder | None = None,
    ) -> None:
        """structured_outputs: makes constrained requests' matchers (None: refuses them).
        speculator: who drafts and which drafts they use (None: no speculative decoding).
        policy: "fcfs", requests in arrival order; "priority", by (priority, arrival time),
        a lower value first: waiting requests are admitted in that order, running ones keep
        it, and a preemption takes the last (vLLM's --scheduling-policy).
        routed_experts: keeps the steps' routed experts and hands each output its tokens'
        (enable_return_routed_experts; None: off)."""
        for name, value in (
            ("max_num_seqs", max_num_seqs),
            ("max_num_batched_tokens", max_num_batched_tokens),
            ("max_model_len", max_model_len),
        ):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.block_manager = block_manager
        self.requests: dict[str, Request] = {}
        if policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling policy must be 'fcfs' or 'priority', got {policy!r}")
        self.policy = policy
        self.waiting: deque[Request] = deque()
        # In admission order ("priority": in priority order): the last one is preempted first.
        self.running: list[Request] = []
        self._finished_req_ids: list[str] = []
        self._preempted_req_ids: list[str] = []  # the victims of the schedule() under way
        # Unfinished requests whose sampling reads earlier sampled tokens on the host.
        self.num_host_dependent = 0
        self.structured_outputs = structured_outputs
        self.num_constrained = 0  # unfinished requests with a grammar
        self.speculator = speculator
        self.routed_experts = routed_experts
        self._speculates = False  # whether this step's batch size lets requests draft
        # Requests whose drafts in flight are their grammar's forced tokens (a request has at
        # most one chunk with drafts in flight: under async scheduling, until the update() of
        # its step, which may come after the next schedule()).
        self._forced_req_ids: set[str] = set()
        # Requests that failed alone (a grammar that did not compile) before any step ran
        # them: the next update() reports them.
        self._failed: list[Request] = []
        # Monotonic counters for metrics: preemptions, prompt tokens looked up in the
        # prefix cache at admission and how many of them hit.
        self.num_preemptions = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    def add_request(self, request: Request) -> None:
        if request.req_id in self.requests:
            raise ValueError(f"request id {request.req_id!r} is already in use")
        so_params = request.sampling_params.structured_outputs
        if so_params is not None:
            if self.structured_outputs is None:
                raise ValueError("this scheduler has no structured output backend")
            request.structured_output = self.structured_outputs.new_request(
                so_params, request.sampling_params.ignore_eos
            )
            self.num_constrained += 1
        self.requests[request.req_id] = request
        self._enqueue(self.waiting, request)
        self.num_host_dependent += needs_host_tokens(request)

    @property
    def can_schedule_ahead(self) -> bool:
        """Whether the next step may be scheduled before the step in flight is applied: no
        request samples from host-side token history, and the step in flight asked the runner
        for no drafts that the next step needs to know (a constrained request's, whose draft
        positions need masks: speculation.py). A request whose drafts the step in flight
        asked for otherwise gets draft slots that the runner fills;
        one whose drafts are in flight goes on where they would all be accepted, and update()
        corrects it, but a constrained one (a grammar's forced drafts) waits for update()."""
        return self.num_host_dependent == 0 and not (
            self.speculator is not None and self.speculator.asked_in_sync
        )

    def get_request(self, req_id: str) -> Request | None:
        return self.requests.get(req_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self._failed)

    def abort_requests(self, req_ids: Iterable[str]) -> None:
        """Finishes the given requests now; unknown and finished ids are ignored."""
        for req_id in req_ids:
            request = self.requests.get(req_id)
            if request is None or request.is_finished:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = RequestStatus.FINISHED_ABORTED
            request.finish_reason = "abort"
            self._finish(request)
            if self.routed_experts is not None:
                self.routed_experts.forget(req_id)

    def catch_up(self) -> None:
        """Applies the step in flight where the next step needs its tokens (async scheduling:
        AsyncScheduler); here every step is applied before the next, so nothing. Reading a
        step's tokens runs the runner's proposer, so the engine calls it before schedule(),
        which launches nothing."""

    def schedule(self, now: float | None = None) -> SchedulerOutput:
        now = time.time() if now is None else now
        for req_id in self._finished_req_ids:
            self.requests.pop(req_id, None)
        finished_req_ids, self._finished_req_ids = self._finished_req_ids, []
        decodes: list[ScheduledChunk] = []
        others: list[ScheduledChunk] = []
        self._preempted_req_ids = []
        budget, preempted = self._schedule_running(self.max_num_batched_tokens, decodes, others)
        new_requests: list[NewRequestData] = []
        # After a preemption memory is short: admitting now would only cause more of them.
        if not preempted:
            self._schedule_waiting(budget, decodes, others, new_requests, now)
        # Prefill chunks by where their context ends, ascending: the attention kernels run a
        # step's query tiles last-first, so its longest tiles (a chunk's last, or a few rows
        # after a long context) start first and none is left to run alone at the end.
        others.sort(key=lambda chunk: chunk.context_end)
        return SchedulerOutput(
            chunks=decodes + others,
            num_decode_chunks=len(decodes),
            new_requests=new_requests,
            finished_req_ids=finished_req_ids,
            preempted_req_ids=self._preempted_req_ids,
            state_copies=self.block_manager.take_state_copies(),
        )

    def grammar_output(self, sched_out: SchedulerOutput) -> GrammarOutput | None:
        """The masks of the step's constrained sampled rows, filled on the host (the grammar
        backend releases the GIL) while the device runs the step's forward; None when no
        sampled row is constrained. The matchers follow every token before the step: here,
        where each step is applied before the next is scheduled, they do."""
        rows = self._constrained_rows(sched_out)
        return None if rows is None else fill_masks(rows, self.structured_outputs)

    def _constrained_rows(self, sched_out: SchedulerOutput) -> GrammarRows | None:
        if not self.num_constrained:
            return None
        return constrained_rows(sched_out.chunks, self.requests)

    def _schedule_running(
        self, budget: int, decodes: list[ScheduledChunk], others: list[ScheduledChunk]
    ) -> tuple[int, bool]:
        """Schedules running requests in order; returns (budget left, whether any preempted)."""
        preempted = False
        running = self.running
        allocate = self.block_manager.allocate_slots
        drafts = self._proposed_drafts()
        forced = {}
        # A grammar's forced tokens win over proposed drafts, where chunks may carry drafts.
        if self.num_constrained and self.block_manager.takes_drafts:
            forced = forced_drafts(running, self.max_model_len)
            drafts |= forced
        # Each draft is one more decode row (draft_step.py); decode rows fit max_num_seqs (and,
        # on a hybrid model, each draft's recurrent state takes a draft slot).
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
                self._forced_req_ids.add(request.req_id)
            while not draft and (new_block_ids := allocate(request, num_new_tokens)) is None:
                # Victims come from the tail, which nothing has been scheduled for this step.
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is request:
                    return budget, preempted
            self._add_chunk(request, num_new_tokens, new_block_ids, decodes, others, draft)
            budget -= num_new_tokens
            i += 1
        return budget, preempted

    def _proposed_drafts(self) -> dict[str, list[int]]:
        """req_id -> the drafts each running request uses this step: the runner's proposals
        after the last step, as the speculator allows them."""
        speculator = self.speculator
        if speculator is None:
            return {}
        self._speculates = speculator.is_active(len(self.running) + len(self.waiting))
        if not self._speculates:
            return {}
        drafts = {}
        for request in self.running:
            draft = speculator.take_drafts(request) or speculator.take_slots(request)
            if draft:
                drafts[request.req_id] = draft
        return drafts

    def _schedule_waiting(
        self,
        budget: int,
        decodes: list[ScheduledChunk],
        others: list[ScheduledChunk],
        new_requests: list[NewRequestData],
        now: float,
    ) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if request.num_pending_tokens:
                return  # preempted with a token in flight: admit it once update() has it
            if self.num_constrained:  # skip requests whose grammar is still compiling
                request = self._first_admissible()
                if request is None:
                    return
            computed_blocks, num_cached_tokens = self.block_manager.get_computed_blocks(request)
            request.num_computed_tokens = num_cached_tokens
            num_new_tokens = self.block_manager.clip_chunk(
                request, min(request.num_tokens - num_cached_tokens, budget)
            )
            new_block_ids = self.block_manager.allocate_slots(
                request, num_new_tokens, computed_blocks
            )
            if new_block_ids is None:
                request.num_computed_tokens = 0
                return
            if request is self.waiting[0]:
                self.waiting.popleft()
            else:
                self.waiting.remove(request)  # passed a request whose grammar compiles
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += num_cached_tokens
            request.status = RequestStatus.RUNNING
            self._enqueue(self.running, request)
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
                request.num_cached_tokens = num_cached_tokens
                new_requests.append(
                    NewRequestData(
                        request.req_id, request.prompt_token_ids, request.sampling_params
                    )
                )
            self._add_chunk(request, num_new_tokens, new_block_ids, decodes, others)
            budget -= num_new_tokens

    def _preempt(self, request: Request) -> None:
        self.block_manager.free(request)
        request.block_ids = []
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._preempted_req_ids.append(request.req_id)
        self._enqueue(self.waiting, request, first=True)

    def _enqueue(
        self, queue: deque[Request] | list[Request], request: Request, first: bool = False
    ) -> None:
        """Puts request in queue by the policy: "fcfs" at the end (at the front where first: a
        preempted request resumes before newer ones), "priority" in (priority, arrival) order."""
        if self.policy == "priority":
            _insert_in_order(queue, request)
        elif first:
            queue.insert(0, request)
        else:
            queue.append(request)

    def _add_chunk(
        self,
        request: Request,
        num_new_tokens: int,
        new_block_ids: list[int],
        decodes: list[ScheduledChunk],
        others: list[ScheduledChunk],
        draft: list[int] | None = None,
    ) -> None:
        """Appends request's chunk to decodes (one sampled token past the prompt) or others,
        and advances the request past it. new_block_ids: the blocks allocated for it this
        step, which the chunk carries to the runner's copy of the block table. draft: draft
        tokens (or slots) after the last known one, or after the pending one (num_new_tokens
        counts them). With drafts in flight, the chunk starts where they would all be accepted."""
        num_computed_tokens = request.num_computed_tokens
        end = num_computed_tokens + num_new_tokens
        num_known_tokens = len(request.all_token_ids)
        token_ids = request.all_token_ids[num_computed_tokens:end]
        num_draft_tokens = len(draft) if draft else 0
        if end - num_draft_tokens > num_known_tokens:  # the pending token, not known yet
            token_ids.append(PLACEHOLDER_TOKEN_ID)
        if num_draft_tokens:
            token_ids += draft
        num_in_flight = request.num_pending_tokens + request.num_pending_drafts
        sample = end == num_known_tokens + num_in_flight + num_draft_tokens
        num_prior_blocks = len(request.block_ids)
        # Positional: at a thousand chunks a step, keyword arguments cost twice the time.
        chunk = ScheduledChunk(
            request.req_id,
            token_ids,
            num_computed_tokens,
            new_block_ids,
            num_prior_blocks,
            sample,
            num_draft_tokens,
            request.state_slot,
        )
        if num_draft_tokens and request.draft_state_slots:
            chunk.draft_state_slots = request.draft_state_slots
        request.block_ids += new_block_ids
        request.num_computed_tokens = end
        if sample:
            if self.speculator is not None:
                self._ask_drafts(request, chunk)
            request.num_pending_tokens += 1
            request.num_pending_drafts += num_draft_tokens
        if (
            (num_new_tokens == 1 or num_draft_tokens)
            and sample
            and num_computed_tokens >= len(request.prompt_token_ids)
        ):
            decodes.append(chunk)  # one sampled token past the prompt, and its drafts
        else:
            others.append(chunk)

    def _ask_drafts(self, request: Request, chunk: ScheduledChunk) -> None:
        """Asks the runner for request's next drafts after this chunk (draft_cap), where the
        speculator allows them at this step's batch size."""
        assert self.speculator is not None
        if self._speculates:
            chunk.draft_cap = self.speculator.ask(request)

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

    def update(
        self, sched_out: SchedulerOutput, runner_out: RunnerOutput | PendingRunnerOutput
    ) -> list[EngineOutput]:
        """Applies one step's results (waiting for a launched step's): progress, sampled
        tokens, stops. One output per request that got a token or prompt logprobs this step."""
        if not isinstance(runner_out, RunnerOutput):
            runner_out = runner_out.result()
        return self._apply(sched_out, runner_out)

    def _apply(self, sched_out: SchedulerOutput, runner_out: RunnerOutput) -> list[EngineOutput]:
        outputs = self.take_failed_outputs()
        all_logprobs, all_prompt_logprobs = runner_out.logprobs, runner_out.prompt_logprobs
        any_running_finished = False
        advanced = {}  # the batched grammar advance of the step's one-token constrained rows
        if self.num_constrained:
            assert self.structured_outputs is not None
            advanced = advance_grammars(self.requests, runner_out, self.structured_outputs)
        routed = self.routed_experts
        if routed is not None and runner_out.routed_experts is not None:
            routed.record(sched_out, runner_out.routed_experts, self.requests)
        i = -1  # the runner samples one token per chunk with sample=True, in chunk order
        for chunk in sched_out.chunks:
            if chunk.sample:
                i += 1
            request = self.requests.get(chunk.req_id)
            if request is None or request.finish_reason is not None:
                continue  # aborted, or finished by the step before this one
            prompt_logprobs = all_prompt_logprobs.get(chunk.req_id) if all_prompt_logprobs else None
            if not chunk.sample:
                if prompt_logprobs is not None:
                    outputs.append(self._make_output(request, [], None, prompt_logprobs))
                continue
            assert runner_out.req_ids[i] == chunk.req_id
            token_ids = [runner_out.sampled_token_ids[i]]
            new_logprobs = None
            if all_logprobs is not None and all_logprobs[i] is not None:
                new_logprobs = [all_logprobs[i]]
            num_drafts = num_accepted = 0  # speculative ones (forced drafts do not count)
            if chunk.num_draft_tokens:
                token_ids, new_logprobs, num_drafts, num_accepted = self._accept_drafts(
                    request, chunk, runner_out, i, token_ids, new_logprobs
                )
            request.num_pending_tokens -= 1
            was_waiting = request.status == RequestStatus.WAITING
            for n, token_id in enumerate(token_ids, 1):
                request.append_output_token(token_id)
                # The grammar's matcher follows every token; its end or failure ends the request.
                grammar_ended = request.structured_output is not None and end_grammar(
                    request, advanced
                )
                if grammar_ended or check_stop(request, self.max_model_len):
                    if was_waiting:
                        self.waiting.remove(request)  # preempted while this token was in flight
                    else:
                        any_running_finished = True
                    self._finish(request)
                    del token_ids[n:]  # tokens after the end are dropped
                    if new_logprobs is not None:
                        del new_logprobs[n:]
                    break
            if chunk.draft_cap and not request.is_finished:
                assert self.speculator is not None
                drafts = runner_out.draft_token_ids.get(chunk.req_id, [])
                self.speculator.receive(request, drafts)
            output = self._make_output(request, token_ids, new_logprobs, prompt_logprobs)
            if num_drafts:
                output.num_draft_tokens, output.num_accepted_tokens = num_drafts, num_accepted
            if runner_out.pooled:
                output.pooled = runner_out.pooled.get(chunk.req_id)
            if routed is not None:
                output.routed_experts = routed.take(request)
            outputs.append(output)
        if any_running_finished:
            self.running = [r for r in self.running if not r.is_finished]
        return outputs

    def _accept_drafts(
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
        speculative = request.req_id not in self._forced_req_ids
        self._forced_req_ids.discard(request.req_id)
        if self.speculator is not None and speculative and num_drafts:
            self.speculator.observe(request, num_drafts, num_accepted)
        if logprobs is not None and num_accepted:
            assert runner_out.draft_logprobs is not None
            logprobs = runner_out.draft_logprobs[i][:num_accepted] + logprobs
        # KV is valid through the last accepted draft; the target's token is computed next.
        # (Preempted while the step ran, it has no KV left: it is recomputed.) A step
        # scheduled meanwhile went on from where all the slots would be accepted: the runner
        # moved it back as far (runner/draft_slots.py).
        if request.status == RequestStatus.RUNNING:
            request.num_computed_tokens -= num_slots - num_accepted
            self.block_manager.trim(request, request.num_computed_tokens + 1)
        counted = (num_drafts, num_accepted) if speculative else (0, 0)
        return accepted + token_ids, logprobs, *counted

    def _finish(self, request: Request) -> None:
        """Releases a request whose status is already final (it may still be in running)."""
        self.block_manager.free(request)
        request.block_ids = []
        self.num_host_dependent -= needs_host_tokens(request)
        self.num_constrained -= request.structured_output is not None
        self._forced_req_ids.discard(request.req_id)
        if self.speculator is not None:
            self.speculator.forget(request.req_id)
        self._finished_req_ids.append(request.req_id)

    def _first_admissible(self) -> Request | None:
        """grammar.first_admissible, releasing the requests whose grammar failed."""
        failed: list[Request] = []
        request = first_admissible(self.waiting, failed)
        for r in failed:
            self._finish(r)
        self._failed += failed
        return request

    def wait_for_grammars(self, timeout: float) -> None:
        """Waits, at most timeout seconds, for a waiting request's grammar compile to end:
        what an engine does instead of stepping again when a step ran nothing and returned
        nothing, so that its unfinished requests all wait for their grammars. Stepping
        meanwhile would hold the GIL that the compile threads, and the grammar backend's
        first build (about a second), need."""
        if self.num_constrained:
            wait_for_compiles(self.waiting, timeout)

    def take_failed_outputs(self) -> list[EngineOutput]:
        """The outputs of requests that failed before running (reported once)."""
        if not self._failed:
            return []
        failed, self._failed = self._failed, []
        return [self._make_output(r, [], None, None) for r in failed]

    @staticmethod
    def _make_output(
        request: Request,
        new_token_ids: list[int],
        new_logprobs: list[LogprobsDict] | None,
        prompt_logprobs: list[LogprobsDict | None] | None,
    ) -> EngineOutput:
        # Positional: at a thousand outputs a step, keyword arguments cost twice the time.
        return EngineOutput(
            request.req_id,
            new_token_ids,
            request.finish_reason is not None,
            request.finish_reason,
            new_logprobs,
            prompt_logprobs,
            request.num_cached_tokens,  # set at first admission, before any chunk
            request.first_scheduled_time,
            request.error,
        )


def _insert_in_order(queue: deque[Request] | list[Request], request: Request) -> None:
    """Puts request after every request of queue that goes before it or with it: by
    (priority, arrival time), ties in the order they came."""
    key = request.priority, request.arrival_time
    index = len(queue)
    while index and (queue[index - 1].priority, queue[index - 1].arrival_time) > key:
        index -= 1
    queue.insert(index, request)
