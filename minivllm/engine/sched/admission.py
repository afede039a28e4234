"""Admission: which waiting requests join the running batch each step, in the scheduling
policy's order ("fcfs": arrival; "priority": (priority, arrival), a lower value first), each
with its prefix-cache hit and its first chunk's blocks. A request whose grammar still compiles
waits without holding up those behind it; one whose compile failed leaves with an error."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Literal

from minivllm.engine.sched.chunks import add_chunk
from minivllm.engine.sched.drafting import Drafting
from minivllm.engine.sched.grammar import first_admissible, wait_for_compiles
from minivllm.engine.sched.kv.block_manager import BlockManager
from minivllm.engine.sched.kv.kv_coordinator import HybridKVCoordinator
from minivllm.engine.sched.request import Request, RequestStatus
from minivllm.engine.types import NewRequestData, ScheduledChunk

Policy = Literal["fcfs", "priority"]


def check_policy(policy: str) -> Policy:
    if policy not in ("fcfs", "priority"):
        raise ValueError(f"scheduling policy must be 'fcfs' or 'priority', got {policy!r}")
    return policy  # type: ignore[return-value]


class Admission:
    """The Scheduler's admission (scheduler.py's Scheduler owns the state named here)."""

    max_num_seqs: int
    block_manager: BlockManager | HybridKVCoordinator
    policy: Policy
    waiting: deque[Request]
    running: list[Request]
    num_constrained: int
    drafting: Drafting
    prefix_cache_queries: int
    prefix_cache_hits: int
    _failed: list[Request]
    _finish: Callable[[Request], None]

    def _schedule_waiting(
        self,
        budget: int,
        decodes: list[ScheduledChunk],
        others: list[ScheduledChunk],
        new_requests: list[NewRequestData],
        now: float,
    ) -> None:
        """Admits waiting requests in order while budget, seats and blocks last."""
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if request.num_pending_tokens:
                return  # preempted with a token in flight: admit it once update() has it
            if self.num_constrained:  # skip requests whose grammar is still compiling
                request = self._first_admissible()
                if request is None:
                    return
            hit = self.block_manager.get_computed_blocks(request)
            if hit is None:
                return  # a longer hit is saved this step: admitted from the next one
            computed_blocks, num_cached_tokens = hit
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
                _first_scheduled(request, num_cached_tokens, now, new_requests)
            add_chunk(request, num_new_tokens, new_block_ids, decodes, others, self.drafting)
            budget -= num_new_tokens

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

    def _enqueue(
        self, queue: deque[Request] | list[Request], request: Request, first: bool = False
    ) -> None:
        """Puts request in queue by the policy: "fcfs" at the end (at the front where first: a
        preempted request resumes before newer ones), "priority" in (priority, arrival) order."""
        if self.policy == "priority":
            insert_in_order(queue, request)
        elif first:
            queue.insert(0, request)
        else:
            queue.append(request)


def _first_scheduled(
    request: Request, num_cached_tokens: int, now: float, new_requests: list[NewRequestData]
) -> None:
    """request's first admission: its metrics' times and cached tokens, and its data for the
    runner."""
    request.first_scheduled_time = now
    request.num_cached_tokens = num_cached_tokens
    new_requests.append(
        NewRequestData(request.req_id, request.prompt_token_ids, request.sampling_params)
    )


def insert_in_order(queue: deque[Request] | list[Request], request: Request) -> None:
    """Puts request after every request of queue that goes before it or with it: by
    (priority, arrival time), ties in the order they came."""
    key = request.priority, request.arrival_time
    index = len(queue)
    while index and (queue[index - 1].priority, queue[index - 1].arrival_time) > key:
        index -= 1
    queue.insert(index, request)
