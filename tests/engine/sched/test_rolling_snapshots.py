"""A decoding request's rolling snapshot: where its decode reaches a block boundary past its
prompt, its state is saved in one slot of its own, keyed by the block's hash (at once under
synchronous scheduling, a step later under async scheduling, or when the request ends), the
boundary before forgotten; when it ends the snapshot stays, so that the next turn (prompt,
answer, new message) hits after the answer. Running requests hold at most a third of the
snapshot slots. And the hit rate of a multi-turn trace, with and without them."""

from __future__ import annotations

import pytest

from minivllm.engine.sched.async_scheduler import AsyncScheduler
from minivllm.engine.sched.kv import rolling_snapshots
from minivllm.engine.sched.kv.kv_coordinator import HybridKVCoordinator
from minivllm.engine.sched.request import Request
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.engine.types import RunnerOutput, SchedulerOutput
from minivllm.sampling_params import SamplingParams
from tests.engine.sched.state_oracle import Pending, StateOracle, oracle_step

BLOCK_SIZE = 4
NUM_STATE_SLOTS = 2  # snapshot slots from 2 on
PROMPT = [1, 2, 3, 4, 5, 6]
TOKEN = 7  # every sampled token


def make_scheduler(is_async: bool, num_snapshots: int = 4):
    kv = HybridKVCoordinator(32, BLOCK_SIZE, NUM_STATE_SLOTS, num_snapshots)
    return (AsyncScheduler if is_async else Scheduler)(4, 64, 64, kv), kv


def step(scheduler: Scheduler, is_async: bool) -> SchedulerOutput:
    sched_out = scheduler.schedule()
    sampled = [c.req_id for c in sched_out.chunks if c.sample]
    out = RunnerOutput(sampled, [TOKEN] * len(sampled))
    scheduler.update(sched_out, Pending(out) if is_async and not sched_out.is_empty else out)
    return sched_out


def add(scheduler: Scheduler, req_id: str, prompt: list[int], max_tokens: int) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    request = Request(req_id, prompt, params, 0.0)
    scheduler.add_request(request)
    return request


def hit(kv: HybridKVCoordinator, num_answer_tokens: int) -> int:
    """The hit of a next turn: PROMPT, num_answer_tokens of TOKEN and a new one."""
    probe = Request("probe", PROMPT + [TOKEN] * num_answer_tokens + [99], SamplingParams(), 0.0)
    return kv.get_computed_blocks(probe)[1]


def run_until_computed(scheduler, request, num_tokens, is_async) -> SchedulerOutput:
    """Steps until a step computes request's position num_tokens - 1: that step's output."""
    while True:
        sched_out = step(scheduler, is_async)
        if request.num_computed_tokens == num_tokens:
            return sched_out


@pytest.mark.parametrize("is_async", [False, True])
def test_the_rolling_snapshot_follows_the_decode(is_async: bool) -> None:
    """PROMPT (6) is saved at 4; its decodes reach 8 and 12, saved in one slot (3), the one of
    8 replaced by the one of 12. Synchronous: found after the step that computes position 7;
    async: after the next one (position 7's token is pending while its step is scheduled)."""
    scheduler, kv = make_scheduler(is_async)
    a = add(scheduler, "a", PROMPT, max_tokens=8)
    sched_out = run_until_computed(scheduler, a, 8, is_async)
    copies = sched_out.state_copies
    assert (copies.save_src, copies.save_dst) == ([a.state_slot], [3])
    assert hit(kv, 2) == (4 if is_async else 8)
    assert step(scheduler, is_async).state_copies is None
    assert hit(kv, 2) == 8
    sched_out = run_until_computed(scheduler, a, 12, is_async)
    assert sched_out.state_copies.save_dst == [3]
    if is_async:
        step(scheduler, is_async)
    assert hit(kv, 6) == 12 and hit(kv, 2) == 4
    while scheduler.has_unfinished_requests():
        step(scheduler, is_async)
    # Finished after 13 computed tokens (its 8th answer token is only sampled): the next turn
    # hits after the answer's last full block.
    assert a.is_finished and hit(kv, 8) == 12
    assert len(kv.snapshots) == 2 and len(kv.rolling) == 0


@pytest.mark.parametrize("is_async", [False, True])
def test_a_last_decode_on_a_boundary_is_kept(is_async: bool) -> None:
    """Three answer tokens: the last decode computes position 7, then the request ends. Async:
    position 7's token is known only when the request ends; its block is cached then, and the
    snapshot keyed."""
    scheduler, kv = make_scheduler(is_async)
    a = add(scheduler, "a", PROMPT, max_tokens=3)
    while scheduler.has_unfinished_requests():
        step(scheduler, is_async)
    assert a.num_computed_tokens == 8 and hit(kv, 3) == 8


def test_running_requests_hold_a_third_of_the_slots() -> None:
    """4 snapshot slots: one rolling snapshot (4 // 3); b, decoding beside a, keeps none
    until a ends."""
    scheduler, kv = make_scheduler(False, num_snapshots=4)
    assert kv.rolling.max_held == 1
    a = add(scheduler, "a", PROMPT, max_tokens=12)
    b = add(scheduler, "b", [50 + i for i in range(6)], max_tokens=20)
    run_until_computed(scheduler, a, 8, False)
    assert len(kv.rolling) == 1 and hit(kv, 2) == 8
    while not a.is_finished:
        step(scheduler, False)
    b_probe = Request("bp", b.all_token_ids[:8] + [99], SamplingParams(), 0.0)
    assert kv.get_computed_blocks(b_probe)[1] == 4  # its prompt's snapshot only
    while scheduler.has_unfinished_requests():
        step(scheduler, False)
    b_probe = Request("bp", b.all_token_ids[:24] + [99], SamplingParams(), 0.0)
    assert kv.get_computed_blocks(b_probe)[1] == 24  # a's ended: b took a slot after


def trace_hit_rate(is_async: bool) -> float:
    """Four conversations of five turns side by side (a shared 16-token system prompt, each
    turn the conversation so far and a new message, answers of 6 to 13 tokens): the share of
    the prompt tokens that the prefix cache serves, each state checked by the oracle."""
    kv = HybridKVCoordinator(200, BLOCK_SIZE, 4, 16)
    scheduler = (AsyncScheduler if is_async else Scheduler)(4, 32, 256, kv)
    oracle = StateOracle(0, 90)
    system = list(range(100, 116))
    prompts = [system + [10 + c] * (3 + c) for c in range(4)]
    num_prompt_tokens = num_cached_tokens = 0
    for turn in range(5):
        params = SamplingParams(max_tokens=6 + (turn * 3) % 8, ignore_eos=True)
        requests = [Request(f"c{c}t{turn}", p, params, 0.0) for c, p in enumerate(prompts)]
        for request in requests:
            scheduler.add_request(request)
        while scheduler.has_unfinished_requests():
            oracle_step(scheduler, oracle, is_async)
        num_prompt_tokens += sum(r.num_prompt_tokens for r in requests)
        num_cached_tokens += sum(r.num_cached_tokens for r in requests)
        prompts = [r.all_token_ids + [20 + turn] * 5 for r in requests]
    return num_cached_tokens / num_prompt_tokens


@pytest.mark.parametrize("is_async", [False, True])
def test_trace_hit_rate_rises(is_async: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    with_rolling = trace_hit_rate(is_async)
    monkeypatch.setattr(rolling_snapshots, "ROLLING_SHARE", 1 << 30)  # none held
    without = trace_hit_rate(is_async)
    print(f"hit rate {without:.3f} -> {with_rolling:.3f}")
    assert with_rolling > 0.8 and with_rolling - without > 0.1
