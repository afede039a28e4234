"""The hybrid prefix cache under random add / step / abort sequences (hypothesis): a fake runner
keeps, per state slot, the tokens its recurrent state has consumed, applies the step's restores
before its chunks and its saves after them, and checks that every chunk continues exactly the
state of its request's earlier tokens (a hit's restored snapshot included). Shared prefixes,
next turns (an earlier request's prompt and answer, hitting its rolling snapshot), few blocks
and snapshot slots (eviction, preemption), chunking, sync and async scheduling; snapshots stay
in their slots, and running requests' rolling ones within their share."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm.engine.sched.async_scheduler import AsyncScheduler
from minivllm.engine.sched.kv.kv_coordinator import HybridKVCoordinator
from minivllm.engine.sched.request import Request
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.sampling_params import SamplingParams
from tests.engine.sched.state_oracle import StateOracle, oracle_step

BLOCK_SIZE = 4
VOCAB = 6  # few tokens: prompts share prefixes often
MAX_MODEL_LEN = 40


@st.composite
def workloads(draw):
    config = dict(
        num_blocks=draw(st.integers(10, 40)),
        num_state_slots=draw(st.integers(1, 4)),
        num_snapshot_slots=draw(st.integers(1, 8)),
        interval=draw(st.sampled_from([0, 8, 12])),
        max_num_batched_tokens=draw(st.integers(3, 24)),
        is_async=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )
    prefix = st.lists(st.integers(1, VOCAB - 1), min_size=4, max_size=20)
    prefixes = draw(st.lists(prefix, min_size=1, max_size=3))
    # Add a request (a prefix, or an earlier request's tokens so far, and its own tokens), run
    # some steps, maybe abort one.
    op = st.tuples(
        st.integers(0, 9),
        st.one_of(st.none(), st.integers(0, 50)),  # the earlier request it follows
        st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=8),
        st.integers(1, 8),  # max_tokens
        st.integers(0, 4),  # steps after
        st.one_of(st.none(), st.integers(0, 50)),  # a request to abort
    )
    return config, prefixes, draw(st.lists(op, min_size=1, max_size=20))


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
    oracle = StateOracle(config["seed"], VOCAB)
    requests: list[Request] = []
    for i, (prefix_index, follow, tokens, max_tokens, num_steps, abort) in enumerate(ops):
        if follow is not None and requests:
            prefix = requests[follow % len(requests)].all_token_ids
        else:
            prefix = prefixes[prefix_index % len(prefixes)]
        prompt = (prefix + tokens)[: MAX_MODEL_LEN - 8]
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        requests.append(Request(f"r{i}", prompt, params, float(i)))
        scheduler.add_request(requests[-1])
        for _ in range(num_steps):
            _checked_step(scheduler, oracle, config, kv)
        if abort is not None:
            scheduler.abort_requests([f"r{abort % (i + 1)}"])
    for _ in range(400):
        if not scheduler.has_unfinished_requests():
            break
        _checked_step(scheduler, oracle, config, kv)
    assert not scheduler.has_unfinished_requests()


def _checked_step(scheduler: Scheduler, oracle: StateOracle, config: dict, kv) -> None:
    """A step through the oracle; its copies touch only snapshot slots on the snapshot side,
    and running requests hold at most their share of them."""
    sched_out = oracle_step(scheduler, oracle, config["is_async"])
    copies = sched_out.state_copies
    first = config["num_state_slots"]
    if copies is not None:
        for slot in copies.restore_src + copies.save_dst:
            assert first <= slot < first + config["num_snapshot_slots"]
    assert len(kv.rolling) <= kv.rolling.max_held


def test_the_oracle_sees_hits() -> None:
    """The same prompt three times, one after the other: the later ones hit."""
    kv = HybridKVCoordinator(32, BLOCK_SIZE, 2, 2)
    scheduler = Scheduler(4, 16, MAX_MODEL_LEN, kv)
    oracle = StateOracle(0, VOCAB)
    for i in range(3):
        params = SamplingParams(max_tokens=3, ignore_eos=True)
        scheduler.add_request(Request(f"r{i}", [1, 2, 3, 4, 5] * 3, params, float(i)))
        while scheduler.has_unfinished_requests():
            oracle_step(scheduler, oracle, False)
    assert oracle.num_hits == 2


@st.composite
def conversations(draw):
    config = dict(
        num_blocks=draw(st.integers(24, 60)),
        num_state_slots=draw(st.integers(1, 3)),
        num_snapshot_slots=draw(st.integers(4, 8)),
        max_num_batched_tokens=draw(st.integers(3, 24)),
        is_async=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )
    message = st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=6)
    turn = st.tuples(st.lists(message, min_size=1, max_size=3), st.integers(1, 12))
    return config, draw(st.lists(turn, min_size=2, max_size=4))


@settings(max_examples=100, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(conversations())
def test_next_turns_continue_the_answers_state(workload) -> None:
    """A few conversations side by side, each turn the one before's prompt and answer and a new
    message, run until all answered: next turns hit in the answers' rolling snapshots (saved
    at the right decode step, keyed once their block is known), and every chunk continues its
    own state."""
    config, turns = workload
    kv = HybridKVCoordinator(
        config["num_blocks"], BLOCK_SIZE, config["num_state_slots"], config["num_snapshot_slots"]
    )
    cls = AsyncScheduler if config["is_async"] else Scheduler
    scheduler = cls(4, config["max_num_batched_tokens"], 4 * MAX_MODEL_LEN, kv)
    oracle = StateOracle(config["seed"], VOCAB)
    last: list[list[int]] = [[] for _ in turns[0][0]]
    for t, (messages, max_tokens) in enumerate(turns):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        requests = []
        for c, tokens in enumerate(last):
            message = messages[c % len(messages)]
            requests.append(Request(f"c{c}t{t}", tokens + message, params, float(t)))
            scheduler.add_request(requests[-1])
        while scheduler.has_unfinished_requests():
            _checked_step(scheduler, oracle, config, kv)
        last = [r.all_token_ids for r in requests]
