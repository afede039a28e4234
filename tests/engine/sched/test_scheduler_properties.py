"""Scheduler + BlockManager invariants under random add / step / abort sequences (hypothesis).

A fake runner samples random tokens. After every operation the KV bookkeeping must add up
(ref counts, free queue, blocks per running request, the runner's copy of each block table);
at the end every request finished or was aborted, and every block is free. Admission is FIFO,
so no request waits while a later one is admitted, and everything finishes in bounded steps.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm.engine.sched.async_scheduler import AsyncScheduler
from minivllm.engine.sched.kv.block_manager import BlockManager
from minivllm.engine.sched.request import Request, RequestStatus
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.engine.types import RunnerOutput, SchedulerOutput
from minivllm.sampling_params import SamplingParams

EOS = 0
VOCAB = 12  # small, so that EOS and stop tokens come up
MAX_EXAMPLES = 300


def block_state(bm: BlockManager) -> tuple[list[int], list[int]]:
    """(ref count per block, free queue in order): the only BlockManager internals read here,
    in one place, so that a change inside it breaks one helper, not the properties."""
    return list(bm.ref_counts), list(bm._free_queue)


@dataclass
class Harness:
    scheduler: Scheduler
    block_size: int
    rng: random.Random
    is_async: bool
    # The runner's copy of each block table, rebuilt from the chunks as a runner does.
    runner_tables: dict[str, list[int]] = field(default_factory=dict)
    admitted: list[str] = field(default_factory=list)  # first admissions, in order
    arrival: dict[str, int] = field(default_factory=dict)
    aborted: set[str] = field(default_factory=set)
    requests: dict[str, Request] = field(default_factory=dict)

    def add(self, req_id: str, prompt: list[int], params: SamplingParams, priority: int) -> None:
        request = Request(req_id, prompt, params, float(len(self.arrival)), None, priority)
        self.arrival[req_id] = len(self.arrival)
        self.requests[req_id] = request
        self.scheduler.add_request(request)

    def abort(self, req_id: str) -> None:
        self.aborted.add(req_id)
        self.scheduler.abort_requests([req_id])

    def step(self) -> None:
        sched_out = self.scheduler.schedule()
        self._mirror_runner(sched_out)
        runner_out = self._fake_run(sched_out)
        if self.is_async and not sched_out.is_empty:
            pending = _Pending(runner_out)
            self.scheduler.update(sched_out, pending)
        else:
            self.scheduler.update(sched_out, runner_out)

    def _mirror_runner(self, sched_out: SchedulerOutput) -> None:
        for req_id in sched_out.finished_req_ids:
            self.runner_tables.pop(req_id, None)
        for new in sched_out.new_requests:
            self.admitted.append(new.req_id)
        for chunk in sched_out.chunks:
            table = self.runner_tables.get(chunk.req_id, [])[: chunk.num_prior_blocks]
            table = table + chunk.new_block_ids
            self.runner_tables[chunk.req_id] = table
            end = chunk.num_computed_tokens + len(chunk.token_ids)
            assert len(table) * self.block_size >= end, "a chunk's tokens have no slot"

    def _fake_run(self, sched_out: SchedulerOutput) -> RunnerOutput:
        req_ids = [c.req_id for c in sched_out.chunks if c.sample]
        return RunnerOutput(req_ids, [self.rng.randrange(VOCAB) for _ in req_ids])


class _Pending:
    def __init__(self, out: RunnerOutput) -> None:
        self.out = out

    def result(self) -> RunnerOutput:
        return self.out


def check_invariants(h: Harness) -> None:
    scheduler, bm = h.scheduler, h.scheduler.block_manager
    ref_counts, free_queue = block_state(bm)
    live = [r for r in h.requests.values() if not r.is_finished]
    held = Counter(b for r in live for b in r.block_ids)
    for block_id in range(bm.num_blocks):
        assert ref_counts[block_id] == held[block_id], f"block {block_id} ref count"
    assert len(free_queue) == len(set(free_queue)), "a block twice in the free queue"
    assert set(free_queue) == {b for b in range(bm.num_blocks) if ref_counts[b] == 0}
    num_used = sum(1 for c in ref_counts if c > 0)
    assert bm.num_free_blocks + num_used == bm.num_blocks
    for request in h.requests.values():
        if request.is_finished:
            assert not request.block_ids
    for request in scheduler.running:
        assert request.status == RequestStatus.RUNNING
        assert len(request.block_ids) * h.block_size >= request.num_computed_tokens
        assert h.runner_tables[request.req_id] == request.block_ids
    for request in scheduler.waiting:
        assert request.status == RequestStatus.WAITING and not request.block_ids
    assert len(scheduler.running) <= scheduler.max_num_seqs
    if scheduler.policy == "priority":  # both queues in (priority, arrival) order
        for queue in (list(scheduler.waiting), scheduler.running):
            keys = [(r.priority, r.arrival_time) for r in queue]
            assert keys == sorted(keys)


def check_fifo_admission(h: Harness) -> None:
    """No request is admitted before one that arrived earlier and was still waiting."""
    order = [h.arrival[r] for r in h.admitted]
    assert order == sorted(order)


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    max_model_len = draw(st.integers(8, 48))
    # Enough blocks for the largest request alone (the engine refuses bigger ones).
    min_blocks = -(-max_model_len // block_size)
    num_blocks = draw(st.integers(min_blocks, min_blocks * 3))
    config = dict(
        block_size=block_size,
        max_model_len=max_model_len,
        num_blocks=num_blocks,
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=draw(st.integers(1, 40)),
        prefix_caching=draw(st.booleans()),
        is_async=draw(st.booleans()),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        seed=draw(st.integers(0, 2**16)),
    )
    prefixes = draw(st.lists(st.lists(st.integers(1, VOCAB - 1), max_size=12), min_size=1))
    op = st.one_of(
        st.tuples(
            st.just("add"),
            st.integers(0, len(prefixes) - 1),
            st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=10),
            st.integers(1, 12),  # max_tokens
            st.booleans(),  # ignore_eos
            st.integers(-2, 2),  # priority (under the priority policy)
        ),
        st.tuples(st.just("step")),
        st.tuples(st.just("abort"), st.integers(0, 50)),
    )
    return config, prefixes, draw(st.lists(op, min_size=1, max_size=40))


def make_harness(config: dict) -> Harness:
    bm = BlockManager(config["num_blocks"], config["block_size"], config["prefix_caching"])
    cls = AsyncScheduler if config["is_async"] else Scheduler
    scheduler = cls(
        config["max_num_seqs"], config["max_num_batched_tokens"], config["max_model_len"], bm,
        None, None, config["policy"],
    )  # fmt: skip
    rng = random.Random(config["seed"])
    return Harness(scheduler, config["block_size"], rng, config["is_async"])


def run_ops(h: Harness, config: dict, prefixes: list[list[int]], ops: list) -> None:
    for op in ops:
        if op[0] == "add":
            _, prefix_index, suffix, max_tokens, ignore_eos, priority = op
            prompt = (prefixes[prefix_index] + suffix)[: config["max_model_len"] - 1]
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
            params.eos_token_ids = [EOS]
            priority = priority if config["policy"] == "priority" else 0
            h.add(f"r{len(h.arrival)}", prompt, params, priority)
        elif op[0] == "step":
            h.step()
        elif h.arrival:
            h.abort(f"r{op[1] % len(h.arrival)}")
        check_invariants(h)


@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(workloads())
def test_random_add_step_abort_keeps_kv_bookkeeping(workload) -> None:
    config, prefixes, ops = workload
    h = make_harness(config)
    run_ops(h, config, prefixes, ops)
    # Drain: every request must finish in a bounded number of steps (no livelock, no
    # request left waiting forever).
    bound = 50 + 4 * sum(r.num_prompt_tokens + 12 for r in h.requests.values())
    num_steps = 0
    while h.scheduler.has_unfinished_requests():
        h.step()
        check_invariants(h)
        num_steps += 1
        assert num_steps <= bound, "requests never finish"
    for _ in range(2):  # apply a step still in flight; hand the last finished ids over
        h.step()
        check_invariants(h)
    for request in h.requests.values():
        assert request.is_finished
        if request.finish_reason != "abort":
            assert 1 <= request.num_output_tokens <= request.sampling_params.max_tokens
    bm = h.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks  # cached blocks count as free
    assert not h.runner_tables
    if config["policy"] == "fcfs":
        check_fifo_admission(h)
