"""BlockManager: exact block ids for allocation, prefix hits, LRU eviction and collisions."""

from __future__ import annotations

import pytest

from minivllm.engine.sched.kv import block_manager as block_manager_module
from minivllm.engine.sched.kv.block_manager import BlockManager, hash_block_tokens
from minivllm.engine.sched.request import Request
from minivllm.sampling_params import SamplingParams

BLOCK_SIZE = 4


def make_request(
    req_id: str, prompt_token_ids: list[int], cache_salt: str | None = None
) -> Request:
    return Request(req_id, prompt_token_ids, SamplingParams(), 0.0, cache_salt)


def allocate(
    manager: BlockManager,
    request: Request,
    num_new_tokens: int,
    computed_blocks: list[int] | None = None,
) -> list[int] | None:
    """allocate_slots, recording the new blocks in request.block_ids as the scheduler does."""
    new_block_ids = manager.allocate_slots(request, num_new_tokens, computed_blocks)
    if new_block_ids is not None:
        request.block_ids += new_block_ids
    return new_block_ids


def admit(manager: BlockManager, request: Request) -> tuple[list[int], int]:
    """What the scheduler does on admission: prefix lookup, then allocate the whole prompt."""
    computed_blocks, num_cached_tokens = manager.get_computed_blocks(request)
    request.num_computed_tokens = num_cached_tokens
    num_new_tokens = request.num_tokens - num_cached_tokens
    new_block_ids = allocate(manager, request, num_new_tokens, computed_blocks)
    assert new_block_ids is not None and new_block_ids[: len(computed_blocks)] == computed_blocks
    return computed_blocks, num_cached_tokens


def take_one_block(manager: BlockManager, req_id: str) -> int:
    [block_id] = allocate(manager, make_request(req_id, [1000 + len(req_id)]), 1)
    return block_id


def test_fresh_manager_allocates_in_order():
    manager = BlockManager(num_blocks=10, block_size=BLOCK_SIZE, enable_prefix_caching=False)
    a = make_request("a", list(range(10)))
    assert manager.allocate_slots(a, 10) == [0, 1, 2]
    assert a.block_ids == []  # the caller records them
    b = make_request("b", list(range(5)))
    assert manager.allocate_slots(b, 5) == [3, 4]
    assert manager.num_free_blocks == 5
    assert manager.usage == pytest.approx(0.5)
    assert manager.ref_counts[:6] == [1, 1, 1, 1, 1, 0]


def test_allocation_grows_one_block_at_a_boundary():
    manager = BlockManager(num_blocks=4, block_size=BLOCK_SIZE, enable_prefix_caching=False)
    a = make_request("a", [1, 2, 3, 4])
    assert allocate(manager, a, 4) == [0]
    a.num_computed_tokens = 4
    a.append_output_token(5)
    assert allocate(manager, a, 1) == [1]  # position 4 starts block 2 of the table
    a.num_computed_tokens = 5
    a.append_output_token(6)
    assert allocate(manager, a, 1) == []  # position 5 fits in block 1
    assert a.block_ids == [0, 1]


def test_failed_allocation_changes_nothing():
    manager = BlockManager(num_blocks=3, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    a = make_request("a", list(range(9)))
    assert allocate(manager, a, 9) == [0, 1, 2]
    b = make_request("b", [7])
    assert manager.allocate_slots(b, 1) is None
    assert manager.num_free_blocks == 0
    manager.free(a)
    # c shares a's first block (free, cached): it needs that one revived plus 3 new blocks.
    c = make_request("c", list(range(4)) + [50] * 12)
    computed_blocks, num_cached = manager.get_computed_blocks(c)
    assert (computed_blocks, num_cached) == ([0], 4)
    c.num_computed_tokens = num_cached
    assert manager.allocate_slots(c, 12, computed_blocks) is None
    assert manager.num_free_blocks == 3
    assert manager.ref_counts == [0, 0, 0]


def test_free_releases_references_and_keeps_shared_blocks():
    manager = BlockManager(num_blocks=6, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    a = make_request("a", list(range(10)))
    admit(manager, a)
    b = make_request("b", list(range(8)) + [99, 98])
    assert admit(manager, b) == ([0, 1], 8)
    assert b.block_ids == [0, 1, 3]
    assert manager.ref_counts == [2, 2, 1, 1, 0, 0]
    manager.free(a)
    assert manager.ref_counts == [1, 1, 0, 1, 0, 0]
    assert manager.num_free_blocks == 3
    manager.free(b)
    assert manager.num_free_blocks == 6 and manager.usage == 0.0


def test_hash_chain():
    first = hash_block_tokens(None, [1, 2, 3, 4])
    assert first == hash_block_tokens(None, [1, 2, 3, 4])
    assert first != hash_block_tokens(None, [1, 2, 3, 5])
    second = hash_block_tokens(first, [5, 6, 7, 8])
    assert second == hash_block_tokens(first, [5, 6, 7, 8])
    # Same tokens after a different parent: a different block.
    assert second != hash_block_tokens(hash_block_tokens(None, [0, 2, 3, 4]), [5, 6, 7, 8])
    assert second != hash_block_tokens(None, [5, 6, 7, 8])

    manager = BlockManager(num_blocks=8, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    a = make_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = make_request("b", [1, 2, 3, 4, 5, 6, 7, 8, 10])
    c = make_request("c", [0, 2, 3, 4, 5, 6, 7, 8, 9])
    for request in (a, b, c):
        admit(manager, request)
    assert a.block_hashes == [first, second]  # only full blocks are hashed
    assert b.block_hashes == a.block_hashes
    assert c.block_hashes[0] != a.block_hashes[0]
    assert c.block_hashes[1] != a.block_hashes[1]


def test_prefix_hit_reuses_exact_blocks():
    manager = BlockManager(num_blocks=10, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    a = make_request("a", list(range(10)))
    assert admit(manager, a) == ([], 0)
    assert a.block_ids == [0, 1, 2]
    b = make_request("b", list(range(8)) + [100, 101, 102])
    assert admit(manager, b) == ([0, 1], 8)
    assert b.block_ids == [0, 1, 3]
    assert manager.num_free_blocks == 6
    # A hit on the first block only: the second differs.
    c = make_request("c", list(range(4)) + [200] * 5)
    assert admit(manager, c) == ([0], 4)
    assert c.block_ids == [0, 4, 5]


def test_prefix_hit_leaves_at_least_one_token_to_compute():
    manager = BlockManager(num_blocks=10, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    a = make_request("a", list(range(10)))
    admit(manager, a)
    exact = make_request("exact", list(range(8)))  # exactly a's two full blocks
    assert manager.get_computed_blocks(exact) == ([0], 4)
    one_more = make_request("one_more", list(range(9)))
    assert manager.get_computed_blocks(one_more) == ([0, 1], 8)
    # The recomputed last block duplicates block 1: it stays uncached, block 1 stays the hit.
    admit(manager, exact)
    assert exact.block_ids == [0, 3]
    assert manager.get_computed_blocks(make_request("again", list(range(9)))) == ([0, 1], 8)


def test_prefix_caching_off_never_hits():
    manager = BlockManager(num_blocks=10, block_size=BLOCK_SIZE, enable_prefix_caching=False)
    a = make_request("a", list(range(10)))
    admit(manager, a)
    b = make_request("b", list(range(10)))
    assert admit(manager, b) == ([], 0)
    assert b.block_ids == [3, 4, 5]


def test_hit_on_freed_but_cached_blocks():
    manager = BlockManager(num_blocks=10, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    a = make_request("a", list(range(10)))
    admit(manager, a)
    manager.free(a)
    assert manager.num_free_blocks == 10
    b = make_request("b", list(range(8)) + [55])
    assert admit(manager, b) == ([0, 1], 8)
    # Blocks 0 and 1 leave the free queue; the new block is the front of the queue (3).
    assert b.block_ids == [0, 1, 3]
    assert manager.ref_counts[:4] == [1, 1, 0, 1]
    assert manager.num_free_blocks == 7


def test_free_caches_a_block_whose_last_token_came_late():
    """Async scheduling: position 7's token is pending when its decode is scheduled, so its
    block is not cached then; the request ends once the token is known: free caches it."""
    manager = BlockManager(num_blocks=10, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    a = make_request("a", list(range(7)))
    admit(manager, a)
    a.num_computed_tokens = 7
    allocate(manager, a, 1)  # position 7, its token pending
    a.num_computed_tokens = 8
    assert manager.get_computed_blocks(make_request("p", list(range(7)) + [70, 99]))[1] == 4
    a.append_output_token(70)  # the pending token, applied; a ends
    manager.free(a)
    assert manager.get_computed_blocks(make_request("q", list(range(7)) + [70, 99]))[1] == 8


def test_lru_eviction_takes_never_used_then_tail_blocks_first():
    manager = BlockManager(num_blocks=4, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    a = make_request("a", list(range(13)))  # blocks 0, 1, 2 full and cached, 3 partial
    admit(manager, a)
    assert a.block_ids == [0, 1, 2, 3]
    manager.free(a)  # free queue: 3, 2, 1, 0 (tail first)
    prefix = list(range(12)) + [77]
    assert manager.get_computed_blocks(make_request("p", prefix)) == ([0, 1, 2], 12)
    assert take_one_block(manager, "x") == 3  # the partial block: no hit lost
    assert manager.get_computed_blocks(make_request("p", prefix)) == ([0, 1, 2], 12)
    assert take_one_block(manager, "xx") == 2  # a's last full block is evicted first
    assert manager.get_computed_blocks(make_request("p", prefix)) == ([0, 1], 8)
    assert take_one_block(manager, "xxx") == 1
    assert manager.get_computed_blocks(make_request("p", prefix)) == ([0], 4)


def test_recently_freed_blocks_survive_longest():
    manager = BlockManager(num_blocks=4, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    old = make_request("old", [1, 1, 1, 1, 1])
    new = make_request("new", [2, 2, 2, 2, 2])
    admit(manager, old)
    admit(manager, new)
    assert (old.block_ids, new.block_ids) == ([0, 1], [2, 3])
    manager.free(old)
    manager.free(new)  # free queue: 1, 0, 3, 2
    assert take_one_block(manager, "x") == 1
    assert take_one_block(manager, "xx") == 0  # old's cached block goes before new's
    assert manager.get_computed_blocks(make_request("o", [1, 1, 1, 1, 1])) == ([], 0)
    assert manager.get_computed_blocks(make_request("n", [2, 2, 2, 2, 2])) == ([2], 4)


def test_blocks_are_shared_only_within_a_cache_salt():
    manager = BlockManager(num_blocks=16, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    prompt = list(range(10))
    assert admit(manager, make_request("a", prompt, "tenant-a")) == ([], 0)
    assert admit(manager, make_request("a2", prompt, "tenant-a")) == ([0, 1], 8)
    assert admit(manager, make_request("b", prompt, "tenant-b")) == ([], 0)
    assert admit(manager, make_request("plain", prompt)) == ([], 0)
    assert admit(manager, make_request("plain2", prompt)) == ([7, 8], 8)


def test_a_salt_is_checked_with_the_tokens_on_a_hash_collision(monkeypatch):
    monkeypatch.setattr(block_manager_module, "hash_block_tokens", lambda parent, tokens: 42)
    manager = BlockManager(num_blocks=8, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    admit(manager, make_request("a", [1, 2, 3, 4, 5], "tenant-a"))
    assert admit(manager, make_request("b", [1, 2, 3, 4, 5], "tenant-b")) == ([], 0)
    assert admit(manager, make_request("a2", [1, 2, 3, 4, 6], "tenant-a")) == ([0], 4)


def test_hash_collision_is_a_miss(monkeypatch):
    monkeypatch.setattr(block_manager_module, "hash_block_tokens", lambda parent, tokens: 42)
    manager = BlockManager(num_blocks=8, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    a = make_request("a", [1, 2, 3, 4, 5])
    admit(manager, a)
    assert a.block_hashes == [42]
    other = make_request("other", [9, 9, 9, 9, 5])
    assert admit(manager, other) == ([], 0)  # same hash, different tokens
    assert other.block_ids == [2, 3]
    same = make_request("same", [1, 2, 3, 4, 6])
    assert admit(manager, same) == ([0], 4)


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(num_blocks=0, block_size=4, enable_prefix_caching=True)
