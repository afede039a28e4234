"""The KV cache's bookkeeping over its layer groups: the paged blocks of the attention layers
(BlockManager) and, in a hybrid model, one recurrent-state slot per running request for the
linear-attention layers. The scheduler's allocate / free stay one call each.

A slot is taken when a request is first given blocks and given back when it finishes or is
preempted: preemption recomputes, so the request's next chunk starts from a fresh state.

Prefix caching: a cached prefix is reusable only where the recurrent state after it is kept,
so a hit is the longest run of cached blocks whose end has a snapshot (state_snapshots.py);
the request's slot is restored from it before the step's forward. Snapshots are saved where a
chunk ends on a snapshot point of its request: the last block boundary of the tokens known at
admission (a longer prompt, the next turn of a chat, starts with them), the end of the cached
blocks where no snapshot was found (a prefix another request has shared: the next one hits
there) and every snapshot_interval tokens. clip_chunk ends a chunk at the next such point. A
request whose cached blocks have a snapshot being saved past its hit waits for it a step.
Past the tokens known at admission (the output), each block boundary a decode reaches is saved
in the request's rolling snapshot (rolling_snapshots.py): the next turn hits after the answer.

Drafts (speculative decoding, a grammar's forced tokens): a decode chunk with d drafts takes d
draft-state slots for the states after its first d tokens (draft_states.py); trim, once the drafts
are verified, keeps the state after the accepted ones and saves a block boundary among them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from minivllm.engine.sched.kv.block_manager import BlockManager
from minivllm.engine.sched.kv.draft_states import DraftStates
from minivllm.engine.sched.kv.rolling_snapshots import RollingSnapshots
from minivllm.engine.sched.kv.state_snapshots import SnapshotCache
from minivllm.engine.sched.request import Request
from minivllm.engine.types import StateCopies

logger = logging.getLogger(__name__)


@dataclass
class _Plan:
    """A request's snapshot points besides the interval's, and its hit's snapshot slot."""

    junction: int  # the end of its cached blocks where no snapshot was found; 0: none
    known_end: int  # the last block boundary of the tokens known at admission
    restore_slot: int  # the snapshot its hit resumes from; -1: no hit


class HybridKVCoordinator:
    """BlockManager's interface over the paged blocks, num_state_slots state slots, (with
    prefix caching) num_snapshot_slots snapshot slots after them in the runner's pool, and
    num_draft_state_slots draft-state slots after those (with speculative decoding)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_state_slots: int,
        num_snapshot_slots: int = 0,
        snapshot_interval: int = 0,
        num_draft_state_slots: int = 0,
    ) -> None:
        if num_state_slots < 1:
            raise ValueError(f"num_state_slots must be at least 1, got {num_state_slots}")
        if snapshot_interval < 0 or snapshot_interval % block_size:
            raise ValueError(
                f"snapshot_interval ({snapshot_interval}) must be a multiple of block_size "
                f"({block_size}), or 0 for none"
            )
        self.blocks = BlockManager(num_blocks, block_size, num_snapshot_slots > 0)
        self.block_size = block_size
        self.num_state_slots = num_state_slots
        # Invariant: a slot is free <=> no request's state_slot holds it. Lowest first.
        self._free_slots = list(range(num_state_slots - 1, -1, -1))
        self.snapshots: SnapshotCache | None = None
        self.rolling: RollingSnapshots | None = None
        if num_snapshot_slots:
            self.snapshots = SnapshotCache(self.blocks, num_state_slots, num_snapshot_slots)
            self.rolling = RollingSnapshots(self.snapshots, self.blocks)
        self.snapshot_interval = snapshot_interval
        self.drafts: DraftStates | None = None
        if num_draft_state_slots:
            self.drafts = DraftStates(num_state_slots + num_snapshot_slots, num_draft_state_slots)
        self._plans: dict[str, _Plan] = {}
        self._copies = StateCopies()

    @property
    def takes_drafts(self) -> bool:
        """Whether a decode chunk may carry drafts: only with draft-state slots for their states
        (a recurrent state advanced over a rejected draft is not rolled back otherwise)."""
        return self.drafts is not None

    @property
    def num_free_draft_state_slots(self) -> int:
        """How many draft tokens the step may still schedule (one draft-state slot each)."""
        return 0 if self.drafts is None else self.drafts.num_free

    @property
    def num_blocks(self) -> int:
        return self.blocks.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.blocks.num_free_blocks

    @property
    def num_free_state_slots(self) -> int:
        return len(self._free_slots)

    @property
    def usage(self) -> float:
        return self.blocks.usage

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int] | None:
        """The longest cached prefix of full blocks whose end has a state snapshot:
        (block_ids, num_cached_tokens); ([], 0) without prefix caching. None where this step
        saves a snapshot further into request's cached blocks (another request computes
        through their shared prefix): admitted a step later, request hits there instead of
        computing that prefix once more."""
        if self.snapshots is None:
            return [], 0
        block_ids, _ = self.blocks.get_computed_blocks(request)
        num_hit, slot = self.snapshots.longest_hit(request.block_hashes, block_ids)
        if self.snapshots.saving_after(request.block_hashes, num_hit, len(block_ids)):
            return None
        junction = len(block_ids) * self.block_size if len(block_ids) > num_hit else 0
        known_end = request.num_tokens // self.block_size * self.block_size
        self._plans[request.req_id] = _Plan(junction, known_end, slot)
        return block_ids[:num_hit], num_hit * self.block_size

    def clip_chunk(self, request: Request, num_new_tokens: int) -> int:
        """num_new_tokens, or fewer where request's next snapshot point comes first (so that
        the chunk ends there and its state can be saved)."""
        if self.snapshots is None or num_new_tokens <= 1:
            return num_new_tokens
        start = request.num_computed_tokens
        return min(num_new_tokens, self._next_point(request, start) - start)

    def _next_point(self, request: Request, start: int) -> int:
        """request's first snapshot point past position start (a large number for none)."""
        plan = self._plans.get(request.req_id)
        points = [1 << 62]
        if plan is not None:
            points += [p for p in (plan.junction, plan.known_end) if p > start]
        if self.snapshot_interval:
            points.append((start // self.snapshot_interval + 1) * self.snapshot_interval)
        return min(points)

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed_blocks: list[int] | None = None
    ) -> list[int] | None:
        """BlockManager.allocate_slots, and a state slot for a request without one (restored
        from its hit's snapshot); None, changing nothing, when either runs out. Saves the
        state where the chunk ends on a snapshot point. A decode chunk with drafts (the
        tokens past the known and pending ones) takes a draft-state slot for each, or gets None."""
        needs_slot = request.state_slot < 0
        if needs_slot and not self._free_slots:
            return None
        num_drafts = (
            request.num_computed_tokens + num_new_tokens
            - len(request.all_token_ids) - request.num_pending_tokens
        )  # fmt: skip
        if num_drafts > self.num_free_draft_state_slots:
            return None
        new_block_ids = self.blocks.allocate_slots(request, num_new_tokens, computed_blocks)
        if new_block_ids is None:
            return None
        if num_drafts > 0:
            assert self.drafts is not None
            self.drafts.take(request, num_drafts)
        if needs_slot:
            request.state_slot = self._free_slots.pop()
            plan = self._plans.get(request.req_id)
            if plan is None:  # admitted without a lookup
                known_end = request.num_tokens // self.block_size * self.block_size
                plan = self._plans[request.req_id] = _Plan(0, known_end, -1)
            if computed_blocks and plan.restore_slot >= 0:
                self._copies.restore_src.append(plan.restore_slot)
                self._copies.restore_dst.append(request.state_slot)
        if self.rolling is not None:
            self.rolling.publish_pending(request)
            if num_drafts <= 0:  # a drafted chunk's state is saved once verified (trim)
                self._save_at_chunk_end(request, num_new_tokens)
        return new_block_ids

    def _save_at_chunk_end(self, request: Request, num_new: int) -> None:
        """Saves request's state after its chunk of num_new tokens where the chunk ends on a
        snapshot point of known tokens, whose last block is cached; past the tokens known at
        admission, on any block boundary, in its rolling snapshot."""
        start = request.num_computed_tokens
        end = start + num_new
        if end % self.block_size:
            return
        if end > self._plans[request.req_id].known_end:
            assert self.rolling is not None
            self.rolling.save(request, end, self._copies)
            return
        if self._next_point(request, start) != end:
            return
        index = end // self.block_size - 1
        # The cached block of the prefix's end: request's own, or another request's of the
        # same tokens (then request's block is a duplicate, not cached).
        block_id = self.blocks.cached_block_of(request, index)
        if block_id is None:
            return
        assert self.snapshots is not None
        slot = self.snapshots.reserve(request.block_hashes[index], block_id)
        if slot >= 0:
            self._copies.save_src.append(request.state_slot)
            self._copies.save_dst.append(slot)

    def take_state_copies(self) -> StateCopies | None:
        """The step's restores and saves (None: none); the step's snapshots are found from
        the next step on. Called once a step, when the schedule is complete."""
        if self.snapshots is not None:
            self.snapshots.end_step()
        copies = self._copies
        if not copies.restore_src and not copies.save_src:
            return None
        self._copies = StateCopies()
        return copies

    def free(self, request: Request) -> None:
        """Drops request's blocks (caching those computed whose tokens are known) and gives
        its state slot back; its rolling snapshot stays where it can be keyed."""
        self.blocks.free(request)
        if self.rolling is not None:
            self.rolling.release(request)
        self._plans.pop(request.req_id, None)
        if self.drafts is not None:
            self.drafts.release(request)
        if request.state_slot >= 0:
            self._free_slots.append(request.state_slot)
            request.state_slot = -1

    def trim(self, request: Request, num_tokens: int) -> None:
        """BlockManager.trim after a step with drafts; request.num_computed_tokens counts its
        accepted drafts: its state after them is kept (and a block boundary among them saved
        in its rolling snapshot)."""
        self.blocks.trim(request, num_tokens)
        if self.drafts is None or not request.draft_state_slots:
            return
        end = request.num_computed_tokens // self.block_size * self.block_size
        src = self.drafts.slot_after(request, end)
        if self.rolling is not None and src >= 0 and end > self._plans[request.req_id].known_end:
            self.rolling.save(request, end, self._copies, src)
        self.drafts.accept(request, request.num_computed_tokens, self._copies)


def make_kv_coordinator(
    num_blocks: int,
    block_size: int,
    enable_prefix_caching: bool,
    num_state_slots: int,
    num_snapshot_slots: int = 0,
    snapshot_interval: int = 0,
    num_draft_state_slots: int = 0,
) -> BlockManager | HybridKVCoordinator:
    """The BlockManager of a model with attention layers only (num_state_slots 0); else the
    hybrid coordinator over num_state_slots slots, num_snapshot_slots snapshots and
    num_draft_state_slots draft-state slots (as many as the runner's state pool has;
    snapshots only with prefix caching)."""
    if not num_state_slots:
        return BlockManager(num_blocks, block_size, enable_prefix_caching)
    if enable_prefix_caching and not num_snapshot_slots:
        logger.info(
            "prefix caching finds no hits on this hybrid model: no recurrent-state snapshot "
            "slots (deterministic mode, or no room for one in the cache budget)"
        )
    if not enable_prefix_caching:
        num_snapshot_slots = 0
    return HybridKVCoordinator(
        num_blocks, block_size, num_state_slots, num_snapshot_slots, snapshot_interval,
        num_draft_state_slots,
    )  # fmt: skip
