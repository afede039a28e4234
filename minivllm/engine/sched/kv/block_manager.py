"""BlockManager: the paged KV cache's bookkeeping (free queue, ref counts, prefix cache).

Pure Python: it hands out block ids; the model runner owns the tensors they index.
"""

from __future__ import annotations

import sys
from array import array
from collections import OrderedDict
from collections.abc import Sequence

import xxhash

from minivllm.engine.sched.request import Request


def hash_block_tokens(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """Chained hash of one full block: it identifies the block's tokens and all before them."""
    hasher = xxhash.xxh3_64()
    if parent_hash is not None:
        hasher.update(parent_hash.to_bytes(8, "little"))
    hasher.update(array("q", token_ids).tobytes())
    return hasher.intdigest()


def salt_hash(cache_salt: str | None) -> int | None:
    """The parent of a request's first block: its cache salt's hash (None without one), so
    that requests of different salts share no block, whatever their tokens."""
    if cache_salt is None:
        return None
    return xxhash.xxh3_64_intdigest(cache_salt.encode("utf-8", errors="surrogatepass"))


class BlockManager:
    """Hands out fixed-size KV blocks to requests and reuses blocks of shared prefixes.

    A block is cached (hittable) once its block_size tokens are known; a cached block whose
    ref count drops to 0 stays hittable in the free queue until it is handed out again.
    The free queue is LRU: freed blocks join the back, allocation takes from the front.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"num_blocks ({num_blocks}) and block_size ({block_size}) must be at least 1"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        # Invariant: ref_counts[b] == 0 <=> b is in the free queue. Values are unused.
        self._free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._hash_to_block: dict[int, int] = {}
        self._block_hash: list[int | None] = [None] * num_blocks
        # Tokens of each cached block (a first block's with its request's cache salt), so
        # that a hash collision is a miss, not wrong KV.
        self._block_tokens: list[tuple | None] = [None] * num_blocks
        # req_id -> how many of its leading blocks have been offered to the cache.
        self._num_hashed_blocks: dict[str, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_queue)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (free cached blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def cached_block(self, block_hash: int) -> int | None:
        """The block whose content is cached under block_hash, or None."""
        return self._hash_to_block.get(block_hash)

    def cached_block_of(self, request: Request, block_index: int) -> int | None:
        """The cached block holding the content of request's full block block_index (its own,
        or another request's of the same tokens), or None; its hash must be known."""
        block_id = self._hash_to_block.get(request.block_hashes[block_index])
        if block_id is None:
            return None
        same = self._block_tokens[block_id] == self._block_key(request, block_index)
        return block_id if same else None

    # Whether a decode chunk may carry draft tokens (speculative or a grammar's forced ones),
    # and how many a step may schedule: rejected drafts roll back here by freeing KV slots, so
    # no bound (the hybrid coordinator's recurrent states need a draft-state slot each).
    takes_drafts = True
    num_free_draft_state_slots = sys.maxsize

    def clip_chunk(self, request: Request, num_new_tokens: int) -> int:
        """How many of num_new_tokens request's next chunk may compute: all of them (the
        hybrid coordinator ends chunks where recurrent states are snapshotted)."""
        return num_new_tokens

    def take_state_copies(self) -> None:
        """A step's recurrent-state copies: none without recurrent states (the hybrid
        coordinator's are a StateCopies)."""
        return None

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Longest cached prefix of request's full blocks: (block_ids, num_cached_tokens).

        Never covers all of request's tokens: the last one must be computed to sample.
        Takes no references; pass the block ids to allocate_slots.
        """
        # Prompt logprobs (and mean or cls pooling) need every prompt position computed, so
        # such requests never hit.
        params = request.sampling_params
        if (
            not self.enable_prefix_caching
            or params.prompt_logprobs is not None
            or (params.pooling is not None and params.pooling.needs_all_rows)
        ):
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        self._extend_block_hashes(request, max_blocks)
        block_ids: list[int] = []
        for i in range(max_blocks):
            block_id = self._hash_to_block.get(request.block_hashes[i])
            if block_id is None or self._block_tokens[block_id] != self._block_key(request, i):
                break
            block_ids.append(block_id)
        return block_ids, len(block_ids) * self.block_size

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed_blocks: list[int] | None = None
    ) -> list[int] | None:
        """The blocks to append to request.block_ids so that it holds num_computed_tokens +
        num_new_tokens tokens, or None, changing nothing, when too few blocks are free.

        computed_blocks (from get_computed_blocks, for a request without blocks) come first in
        the result; request.num_computed_tokens must already count their tokens. The caller
        records the result in request.block_ids.
        """
        num_tokens = request.num_computed_tokens + num_new_tokens
        num_new_blocks = -(-num_tokens // self.block_size) - len(request.block_ids)
        if computed_blocks:
            new_block_ids = self._take_computed_blocks(computed_blocks, num_new_blocks)
            if new_block_ids is None:
                return None
        elif num_new_blocks <= 0:
            new_block_ids = []  # the common decode step: its block has room
        elif num_new_blocks > self.num_free_blocks:
            return None
        else:
            new_block_ids = [self._pop_free_block() for _ in range(num_new_blocks)]
        if self.enable_prefix_caching:
            # Full blocks whose tokens are known get cached; their KV is written this step. A
            # pending token (async scheduling) is not known yet: its block waits a step.
            num_full_blocks = min(num_tokens, len(request.all_token_ids)) // self.block_size
            if num_full_blocks > self._num_hashed_blocks.get(request.req_id, 0):
                block_ids = request.block_ids + new_block_ids
                self._cache_full_blocks(request, block_ids, num_full_blocks)
        return new_block_ids

    def _take_computed_blocks(
        self, computed_blocks: list[int], num_new_blocks: int
    ) -> list[int] | None:
        """References computed_blocks and appends the new blocks beyond them, or returns None,
        changing nothing, when too few blocks are free."""
        num_new_blocks = max(num_new_blocks - len(computed_blocks), 0)
        # A hit on a free cached block takes it out of the free queue too.
        num_revived = sum(1 for b in computed_blocks if self.ref_counts[b] == 0)
        if num_new_blocks + num_revived > self.num_free_blocks:
            return None
        for block_id in computed_blocks:
            if self.ref_counts[block_id] == 0:
                del self._free_queue[block_id]
            self.ref_counts[block_id] += 1
        return computed_blocks + [self._pop_free_block() for _ in range(num_new_blocks)]

    def free(self, request: Request) -> None:
        """Drops request's references to request.block_ids, tail first so that its tail blocks
        are evicted first; its computed full blocks whose tokens are known are cached first (a
        block whose last token was pending when it was computed, under async scheduling). The
        caller clears request.block_ids."""
        if self.enable_prefix_caching:
            num_known = min(request.num_computed_tokens, len(request.all_token_ids))
            num_full_blocks = num_known // self.block_size
            if num_full_blocks > self._num_hashed_blocks.get(request.req_id, 0):
                self._cache_full_blocks(request, request.block_ids, num_full_blocks)
        for block_id in reversed(request.block_ids):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self._free_queue[block_id] = None
        self._num_hashed_blocks.pop(request.req_id, None)

    def trim(self, request: Request, num_tokens: int) -> None:
        """Gives back request's blocks past those that hold its first num_tokens tokens (the
        slots of draft tokens a step rejected). Those blocks hold no known token, so none is
        cached."""
        num_kept = -(-num_tokens // self.block_size)
        for block_id in reversed(request.block_ids[num_kept:]):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self._free_queue[block_id] = None
        del request.block_ids[num_kept:]

    def _pop_free_block(self) -> int:
        block_id, _ = self._free_queue.popitem(last=False)
        block_hash = self._block_hash[block_id]
        if block_hash is not None:
            # Reused for other tokens: its old content is no longer hittable.
            if self._hash_to_block.get(block_hash) == block_id:
                del self._hash_to_block[block_hash]
            self._block_hash[block_id] = None
            self._block_tokens[block_id] = None
        self.ref_counts[block_id] = 1
        return block_id

    def _cache_full_blocks(
        self, request: Request, block_ids: list[int], num_full_blocks: int
    ) -> None:
        start = self._num_hashed_blocks.get(request.req_id, 0)
        self._extend_block_hashes(request, num_full_blocks)
        for i in range(start, num_full_blocks):
            block_id = block_ids[i]
            block_hash = request.block_hashes[i]
            # Skip blocks that are cached already (prefix hits) and duplicates of cached
            # content (those stay uncached and are simply freed later).
            if self._block_hash[block_id] is None and block_hash not in self._hash_to_block:
                self._hash_to_block[block_hash] = block_id
                self._block_hash[block_id] = block_hash
                self._block_tokens[block_id] = self._block_key(request, i)
        self._num_hashed_blocks[request.req_id] = num_full_blocks

    def _extend_block_hashes(self, request: Request, num_full_blocks: int) -> None:
        hashes = request.block_hashes
        for i in range(len(hashes), num_full_blocks):
            parent_hash = hashes[i - 1] if i > 0 else salt_hash(request.cache_salt)
            hashes.append(hash_block_tokens(parent_hash, self._tokens_of(request, i)))

    def _tokens_of(self, request: Request, block_index: int) -> tuple[int, ...]:
        start = block_index * self.block_size
        return tuple(request.all_token_ids[start : start + self.block_size])

    def _block_key(self, request: Request, block_index: int) -> tuple:
        """What a cached block must hold for a hit: its tokens, after the salt for a first
        block (a hit is checked block by block from the first, so the prefix is checked too)."""
        tokens = self._tokens_of(request, block_index)
        if block_index == 0 and request.cache_salt is not None:
            return (request.cache_salt, *tokens)
        return tokens
