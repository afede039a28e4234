"""HybridKVCoordinator's prefix cache: a hit is the longest run of cached blocks whose end has
a recurrent-state snapshot, found from the step after the one that saved it, restored into the
request's slot; snapshots are saved where a chunk ends on a snapshot point (the known tokens'
last block boundary, the end of cached blocks without a snapshot, every interval), chunks are
clipped there, and snapshots die with their block and go least recently used first."""

from __future__ import annotations

import pytest

from minivllm.engine.sched.kv.kv_coordinator import HybridKVCoordinator
from minivllm.engine.sched.request import Request
from minivllm.engine.types import StateCopies
from minivllm.sampling_params import SamplingParams

BLOCK_SIZE = 4
NUM_SLOTS = 2  # running slots 0 and 1; snapshot slots from 2 on


def make_request(req_id: str, token_ids: list[int]) -> Request:
    return Request(req_id, token_ids, SamplingParams(), 0.0)


def coordinator(num_blocks: int = 32, num_snapshots: int = 4, interval: int = 0):
    return HybridKVCoordinator(num_blocks, BLOCK_SIZE, NUM_SLOTS, num_snapshots, interval)


def admit(kv: HybridKVCoordinator, request: Request, budget: int = 1000) -> int:
    """What the scheduler does for a waiting request: look up, clip, allocate. Returns the
    chunk's size."""
    computed, num_cached = kv.get_computed_blocks(request)
    request.num_computed_tokens = num_cached
    num_new = kv.clip_chunk(request, min(request.num_tokens - num_cached, budget))
    new_block_ids = kv.allocate_slots(request, num_new, computed)
    assert new_block_ids is not None
    request.block_ids += new_block_ids
    request.num_computed_tokens += num_new
    return num_new


def step(kv: HybridKVCoordinator, request: Request, budget: int = 1000) -> int:
    """A running request's next chunk."""
    num_new = kv.clip_chunk(request, min(request.num_tokens - request.num_computed_tokens, budget))
    new_block_ids = kv.allocate_slots(request, num_new)
    assert new_block_ids is not None
    request.block_ids += new_block_ids
    request.num_computed_tokens += num_new
    return num_new


def finish(kv: HybridKVCoordinator, request: Request) -> None:
    kv.free(request)
    request.block_ids = []


PROMPT = list(range(1, 19))  # 18 tokens: 4 full blocks and 2 more


def test_prompt_is_cut_at_its_last_block_boundary_and_saved_there() -> None:
    kv = coordinator()
    a = make_request("a", PROMPT)
    assert admit(kv, a) == 16  # clipped: the state after 16 tokens is saved
    assert kv.take_state_copies() == StateCopies([], [], save_src=[0], save_dst=[2])
    assert step(kv, a) == 2
    assert kv.take_state_copies() is None


def test_a_hit_needs_a_snapshot_and_is_found_the_step_after() -> None:
    kv = coordinator()
    a = make_request("a", PROMPT)
    admit(kv, a)
    # Same step: the snapshot is written by this step's forward, not found yet: b waits.
    b = make_request("b", PROMPT + [99])
    assert kv.get_computed_blocks(b) is None
    kv.take_state_copies()
    computed, num_cached = kv.get_computed_blocks(b)
    assert num_cached == 16 and computed == a.block_ids[:4]
    b.num_computed_tokens = num_cached
    assert kv.clip_chunk(b, 3) == 3
    assert kv.allocate_slots(b, 3, computed) is not None
    # b's slot (1) is restored from a's snapshot (2) before the forward.
    copies = kv.take_state_copies()
    assert (copies.restore_src, copies.restore_dst) == ([2], [b.state_slot]) == ([2], [1])


def test_partial_hit_diverging_mid_block() -> None:
    """b shares 17 tokens: the blocks match to 16, where a's snapshot is."""
    kv = coordinator()
    a = make_request("a", PROMPT)
    admit(kv, a)
    kv.take_state_copies()
    b = make_request("b", PROMPT[:17] + [90, 91, 92])
    assert kv.get_computed_blocks(b)[1] == 16


def test_cached_blocks_without_a_snapshot_save_one_at_their_end() -> None:
    """b shares 13 tokens: 3 blocks cached, no snapshot after them: b computes from 0, stops
    at 12 to save one; c, sharing them too, hits there."""
    kv = coordinator()
    a = make_request("a", PROMPT)
    admit(kv, a)
    kv.take_state_copies()
    b = make_request("b", PROMPT[:13] + [80] * 8)
    assert admit(kv, b) == 12
    copies = kv.take_state_copies()
    assert copies.save_src == [b.state_slot] and copies.restore_src == []
    c = make_request("c", PROMPT[:14] + [70] * 3)
    assert kv.get_computed_blocks(c)[1] == 12


def test_a_request_waits_a_step_for_a_snapshot_saved_past_its_hit() -> None:
    """b computes a's shared prefix again to save a snapshot at its end (12); c, looking up in
    the same step, waits (None) instead of computing it a third time, and hits 12 a step
    later. d, whose cached blocks end before the snapshot being saved, does not wait."""
    kv = coordinator()
    a = make_request("a", PROMPT)
    admit(kv, a)
    kv.take_state_copies()
    b = make_request("b", PROMPT[:13] + [80] * 8)
    assert admit(kv, b) == 12
    c = make_request("c", PROMPT[:14] + [70] * 3)
    assert kv.get_computed_blocks(c) is None
    d = make_request("d", PROMPT[:9] + [60] * 3)  # 2 cached blocks, a snapshot-free prefix
    assert kv.get_computed_blocks(d) == ([], 0)
    kv.take_state_copies()
    assert kv.get_computed_blocks(c) == (a.block_ids[:3], 12)


def test_snapshot_interval_cuts_long_prompts() -> None:
    kv = coordinator(interval=8)
    a = make_request("a", list(range(1, 23)))  # 22 tokens: points 8, 16 (interval), 20
    assert [admit(kv, a), step(kv, a), step(kv, a), step(kv, a)] == [8, 8, 4, 2]
    b = make_request("b", list(range(1, 12)) + [50] * 4)  # shares 11: hit at the 8
    kv.take_state_copies()
    assert kv.get_computed_blocks(b)[1] == 8


def test_snapshot_dies_with_its_block() -> None:
    """8 blocks: x keeps 2 running; a's 5 are freed, then 4 taken by b (its tail first): a's
    snapshot at 16 is dead (no hit) and its slot is the one b's snapshot takes, not x's older
    but live one. a's prompt again finds a's first block (saves there) and saves a new
    snapshot at 16, under the dead one's hash."""
    kv = coordinator(num_blocks=8, num_snapshots=2)
    x = make_request("x", [100 + i for i in range(8)])
    admit(kv, x)
    kv.take_state_copies()
    a = make_request("a", PROMPT)
    admit(kv, a)
    step(kv, a)
    finish(kv, a)
    assert kv.take_state_copies().save_dst == [3]  # x's is in slot 2
    assert kv.get_computed_blocks(make_request("y", PROMPT))[1] == 16  # still cached
    b = make_request("b", [200 + i for i in range(20)])
    admit(kv, b)
    assert kv.take_state_copies().save_dst == [3]  # the dead snapshot's slot
    finish(kv, b)
    assert kv.get_computed_blocks(make_request("z", PROMPT))[1] == 0
    c = make_request("c", PROMPT)
    assert [admit(kv, c), step(kv, c)] == [4, 12]
    kv.take_state_copies()
    assert kv.get_computed_blocks(make_request("w", PROMPT))[1] == 16


def test_least_recently_used_snapshot_goes_first() -> None:
    kv = coordinator(num_snapshots=2)
    prompts = {name: [base + i for i in range(9)] for name, base in (("a", 100), ("b", 200))}
    for name, prompt in prompts.items():  # a's snapshot, then b's, in two steps
        request = make_request(name, prompt)
        admit(kv, request)
        kv.take_state_copies()
        finish(kv, request)
    assert kv.get_computed_blocks(make_request("a2", prompts["a"] + [1]))[1] == 8  # a used
    admit(kv, make_request("c", [300 + i for i in range(9)]))  # evicts b's, not a's
    kv.take_state_copies()
    assert kv.get_computed_blocks(make_request("a3", prompts["a"] + [2]))[1] == 8
    assert kv.get_computed_blocks(make_request("b2", prompts["b"] + [2]))[1] == 0


def test_snapshots_saved_this_step_are_not_evicted() -> None:
    """One snapshot slot, two saves in one step: the second is skipped."""
    kv = coordinator(num_snapshots=1)
    admit(kv, make_request("a", [100 + i for i in range(9)]))
    admit(kv, make_request("b", [200 + i for i in range(9)]))
    assert kv.take_state_copies().save_src == [0]


def test_free_forgets_the_plan_and_a_preempted_request_hits_again() -> None:
    kv = coordinator()
    a = make_request("a", PROMPT)
    admit(kv, a)
    step(kv, a)
    kv.take_state_copies()
    finish(kv, a)  # preempted: recomputed from its own snapshot
    a.num_computed_tokens = 0
    assert admit(kv, a) == 2 and a.num_computed_tokens == 18
    assert kv.take_state_copies().restore_src == [2]


def test_prefix_caching_off_finds_nothing_and_copies_nothing() -> None:
    kv = coordinator(num_snapshots=0)
    a = make_request("a", PROMPT)
    assert admit(kv, a) == 18
    assert kv.take_state_copies() is None
    assert kv.get_computed_blocks(make_request("b", PROMPT))[1] == 0


def test_interval_must_be_whole_blocks() -> None:
    with pytest.raises(ValueError, match="snapshot_interval"):
        coordinator(interval=6)
