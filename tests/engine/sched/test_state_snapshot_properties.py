"""The hybrid prefix cache under random add / step / abort sequences (hypothesis): a fake runner
keeps, per state slot, the tokens its recurrent state has consumed, applies the step's restores
before its chunks and its saves after them, and checks that every chunk continues exactly the
state of its request's earlier tokens (a hit's restored snapshot included). Shared prefixes,
few blocks and snapshot slots (eviction, preemption), chunking, sync and async scheduling."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm.engine.sched.async_scheduler import AsyncScheduler
from minivllm.engine.sched.kv_coordinator import HybridKVCoordinator
from minivllm.engine.sched.request import Request
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.engine.types import PLACEHOLDER_TOKEN_ID, RunnerOutput, SchedulerOutput
from minivllm.sampling_params import SamplingParams

BLOCK_SIZE = 4
VOCAB = 6  # few tokens: prompts share prefixes often
MAX_MODEL_LEN = 40


class StateOracle:
    """The runner's view: slot -> the tokens its state has consumed."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.slots: dict[int, tuple[int, ...]] = {}
        self.sampled: dict[tuple[str, int], int] = {}  # (req_id, position) -> token
        self.num_hits = 0

    def run(self, sched_out: SchedulerOutput, scheduler: Scheduler) -> RunnerOutput:
        copies = sched_out.state_copies
        if copies is not None:
            self._copy(copies.restore_src, copies.restore_dst)
        req_ids, tokens = [], []
        for chunk in sched_out.chunks:
            request = scheduler.get_request(chunk.req_id)
            start = chunk.num_computed_tokens
            state = self.slots.get(chunk.state_slot, ()) if start else ()
            expected = tuple(self._token(request, i) for i in range(start))
            assert state == expected, f"{chunk.req_id}: its state is not its tokens before {start}"
            new = [self._token(request, start + i) if t == PLACEHOLDER_TOKEN_ID else t
                   for i, t in enumerate(chunk.token_ids)]  # fmt: skip
            self.slots[chunk.state_slot] = state + tuple(new)
            if chunk.sample:
                req_ids.append(chunk.req_id)
                tokens.append(self.rng.randrange(VOCAB))
                self.sampled[(chunk.req_id, chunk.context_end)] = tokens[-1]
        if copies is not None:
            self._copy(copies.save_src, copies.save_dst)
            self.num_hits += len(copies.restore_src)
        return RunnerOutput(req_ids, tokens)

    def _token(self, request: Request, position: int) -> int:
        if position < request.num_tokens:
            return request.all_token_ids[position]
        return self.sampled[(request.req_id, position)]  # pending: sampled, not applied yet

    def _copy(self, src: list[int], dst: list[int]) -> None:
        assert len(set(dst)) == len(dst) and not set(src) & set(dst)
        for s, d in zip(src, dst, strict=True):
            self.slots[d] = self.slots[s]


class _Pending:
    def __init__(self, out: RunnerOutput) -> None:
        self.out = out

    def result(self) -> RunnerOutput:
        return self.out


@st.composite
def workloads(draw):
    config = dict(
        num_blocks=draw(st.integers(10, 40)),
        num_state_slots=draw(st.integers(1, 4)),
        num_snapshot_slots=draw(st.integers(1, 4)),
        interval=draw(st.sampled_from([0, 8, 12])),
        max_num_batched_tokens=draw(st.integers(3, 24)),
        is_async=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )
    prefix = st.lists(st.integers(1, VOCAB - 1), min_size=4, max_size=20)
    prefixes = draw(st.lists(prefix, min_size=1, max_size=3))
    # Add a request (a prefix and its own tokens), run some steps, maybe abort one.
    op = st.tuples(
        st.integers(0, 9),
        st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=8),
        st.integers(1, 8),  # max_tokens
        st.integers(0, 4),  # steps after
        st.one_of(st.none(), st.integers(0, 50)),  # a request to abort
    )
    return config, prefixes, draw(st.lists(op, min_size=1, max_size=20))


def _step(scheduler: Scheduler, oracle: StateOracle, is_async: bool) -> None:
    sched_out = scheduler.schedule()
    out = oracle.run(sched_out, scheduler)
    scheduler.update(sched_out, _Pending(out) if is_async and not sched_out.is_empty else out)


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(workloads())
def test_every_chunk_continues_its_own_state(workload) -> None:
    config, prefixes, ops = workload
    kv = HybridKVCoordinator(
        config["num_blocks"], BLOCK_SIZE, config["num_state_slots"],
        config["num_snapshot_slots"], config["interval"],
    )  # fmt: skip
    cls = AsyncScheduler if config["is_async"] else Scheduler
    scheduler = cls(4, config["max_num_batched_tokens"], MAX_MODEL_LEN, kv)
    oracle = StateOracle(config["seed"])
    for i, (prefix_index, tokens, max_tokens, num_steps, abort) in enumerate(ops):
        prompt = (prefixes[prefix_index % len(prefixes)] + tokens)[: MAX_MODEL_LEN - 8]
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        scheduler.add_request(Request(f"r{i}", prompt, params, float(i)))
        for _ in range(num_steps):
            _step(scheduler, oracle, config["is_async"])
        if abort is not None:
            scheduler.abort_requests([f"r{abort % (i + 1)}"])
    for _ in range(400):
        if not scheduler.has_unfinished_requests():
            break
        _step(scheduler, oracle, config["is_async"])
    assert not scheduler.has_unfinished_requests()


def test_the_oracle_sees_hits() -> None:
    """The same prompt three times, one after the other: the later ones hit."""
    kv = HybridKVCoordinator(32, BLOCK_SIZE, 2, 2)
    scheduler = Scheduler(4, 16, MAX_MODEL_LEN, kv)
    oracle = StateOracle(0)
    for i in range(3):
        params = SamplingParams(max_tokens=3, ignore_eos=True)
        scheduler.add_request(Request(f"r{i}", [1, 2, 3, 4, 5] * 3, params, float(i)))
        while scheduler.has_unfinished_requests():
            _step(scheduler, oracle, False)
    assert oracle.num_hits == 2
