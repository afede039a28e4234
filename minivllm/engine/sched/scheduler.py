"""Scheduler: phase-free continuous batching with chunked prefill and preemption by recompute.

Each step gives every request the tokens it still needs (num_tokens - num_computed_tokens)
within a token budget and a seat limit; running requests first (running.py, which preempts),
then waiting ones (admission.py, FIFO or by priority). The drafts chunks carry are drafting.py's;
a chunk is made in chunks.py. This file owns the state, the step's order and update().
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable

from minivllm.engine.sched.admission import Admission, check_policy
from minivllm.engine.sched.drafting import Drafting
from minivllm.engine.sched.grammar import (
    GrammarMasks,
    GrammarRows,
    advance_grammars,
    constrained_rows,
    end_grammar,
    fill_masks,
    forced_drafts,
)
from minivllm.engine.sched.kv.block_manager import BlockManager
from minivllm.engine.sched.kv.kv_coordinator import HybridKVCoordinator
from minivllm.engine.sched.request import Request, RequestStatus, engine_output, needs_host_tokens
from minivllm.engine.sched.routed_experts import RoutedExpertsRecorder
from minivllm.engine.sched.running import RunningBatch
from minivllm.engine.sched.speculation import Speculator
from minivllm.engine.sched.stop_checker import check_stop
from minivllm.engine.types import (
    EngineOutput,
    GrammarOutput,
    NewRequestData,
    PendingRunnerOutput,
    RunnerOutput,
    ScheduledChunk,
    SchedulerOutput,
)
from minivllm.structured_output.request_state import AdvanceOutcome


class Scheduler(Admission, RunningBatch):
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
        self.policy = check_policy(policy)
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
        self.drafting = Drafting(speculator, block_manager)  # the drafts chunks carry
        self.routed_experts = routed_experts
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
        drafts, forced = self._step_drafts()
        budget, preempted = self._schedule_running(
            self.max_num_batched_tokens, decodes, others, drafts, forced
        )
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

    def _step_drafts(self) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
        """(req_id -> the drafts each running request may carry this step, those of them that
        are a grammar's forced tokens): a grammar's forced tokens win over proposed drafts,
        where chunks may carry drafts."""
        num_requests = len(self.running) + len(self.waiting)
        drafts = self.drafting.proposed_drafts(self.running, num_requests)
        forced = {}
        if self.num_constrained and self.block_manager.takes_drafts:
            forced = forced_drafts(self.running, self.max_model_len)
            drafts |= forced
        return drafts, forced

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
        advanced = {}  # the batched grammar advance of the step's one-token constrained rows
        if self.num_constrained:
            assert self.structured_outputs is not None
            advanced = advance_grammars(self.requests, runner_out, self.structured_outputs)
        routed = self.routed_experts
        if routed is not None and runner_out.routed_experts is not None:
            routed.record(sched_out, runner_out.routed_experts, self.requests)
        return outputs + self._apply_chunks(sched_out, runner_out, advanced)

    def _apply_chunks(
        self,
        sched_out: SchedulerOutput,
        runner_out: RunnerOutput,
        advanced: dict[str, AdvanceOutcome],
    ) -> list[EngineOutput]:
        """The step's chunks applied in order: each sampled chunk's tokens (its accepted drafts
        first) appended up to a stop; one output per request that got a token or prompt
        logprobs. One loop, no call per chunk: at a thousand chunks a step a call costs."""
        outputs = []
        all_logprobs, all_prompt_logprobs = runner_out.logprobs, runner_out.prompt_logprobs
        any_running_finished = False
        routed = self.routed_experts
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
                    outputs.append(engine_output(request, [], None, prompt_logprobs))
                continue
            assert runner_out.req_ids[i] == chunk.req_id
            token_ids = [runner_out.sampled_token_ids[i]]
            new_logprobs = None
            if all_logprobs is not None and all_logprobs[i] is not None:
                new_logprobs = [all_logprobs[i]]
            num_drafts = num_accepted = 0  # speculative ones (forced drafts do not count)
            if chunk.num_draft_tokens:
                token_ids, new_logprobs, num_drafts, num_accepted = self.drafting.accept(
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
                self.drafting.receive(request, chunk, runner_out)
            output = engine_output(request, token_ids, new_logprobs, prompt_logprobs)
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

    def _finish(self, request: Request) -> None:
        """Releases a request whose status is already final (it may still be in running)."""
        self.block_manager.free(request)
        request.block_ids = []
        self.num_host_dependent -= needs_host_tokens(request)
        self.num_constrained -= request.structured_output is not None
        self.drafting.forget(request.req_id)
        self._finished_req_ids.append(request.req_id)

    def take_failed_outputs(self) -> list[EngineOutput]:
        """The outputs of requests that failed before running (reported once)."""
        if not self._failed:
            return []
        failed, self._failed = self._failed, []
        return [engine_output(r, [], None, None) for r in failed]
