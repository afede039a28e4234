"""A decoding request's rolling snapshot: the recurrent state at the latest block boundary of
its output, so that the next turn of a chat (its prompt, its answer and a new message) hits at
the end of the answer, not of its prompt (no torch).

A decode whose chunk ends on a block boundary saves its request's state into the request's one
rolling slot (the one before is overwritten: only the latest boundary is kept while it decodes).
The snapshot is keyed by the hash of the block it ends, known once the block's last token is:
at once under synchronous scheduling, a step later under async scheduling (the decode's input
token was pending when it was scheduled). Until then the slot is held, unkeyed, and found by no
one. When the request ends, its rolling snapshot stays as any other snapshot, hittable and
evicted least recently used first. Running requests hold at most a ROLLING_SHARE-th of the
snapshot slots, so that they do not push out the prompts' snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.engine.sched.kv.block_manager import BlockManager
from minivllm.engine.sched.kv.state_snapshots import SnapshotCache
from minivllm.engine.sched.request import Request
from minivllm.engine.types import StateCopies

# Running requests' rolling snapshots take at most 1 / ROLLING_SHARE of the snapshot slots.
ROLLING_SHARE = 3


@dataclass
class _Rolling:
    slot: int
    block_index: int  # its state is the one after block block_index (its last token included)
    block_hash: int | None  # its key; None while the block's last token is not known


class RollingSnapshots:
    """The running requests' rolling snapshots, in slots of snapshots."""

    def __init__(self, snapshots: SnapshotCache, blocks: BlockManager) -> None:
        self.snapshots = snapshots
        self.blocks = blocks
        self.max_held = snapshots.num_slots // ROLLING_SHARE
        self._held: dict[str, _Rolling] = {}  # req_id -> its rolling snapshot

    def __len__(self) -> int:
        return len(self._held)

    def save(self, request: Request, end: int, copies: StateCopies, src_slot: int = -1) -> None:
        """Saves request's state after its chunk ending at block boundary end (past the tokens
        known at its admission) into its rolling slot, after the step's forward; or, where
        src_slot is given (the state after end tokens of a verified drafted chunk), from
        src_slot before the next step's forward."""
        index = end // self.blocks.block_size - 1
        if index < len(request.block_hashes) and self.snapshots.has_live(
            request.block_hashes[index]
        ):
            return  # that prefix has its snapshot (the same answer again)
        slot = self._take_slot(request)
        if slot < 0:
            return
        rolling = self._held[request.req_id] = _Rolling(slot, index, None)
        if src_slot >= 0:
            copies.restore_src.append(src_slot)
            copies.restore_dst.append(slot)
        else:
            copies.save_src.append(request.state_slot)
            copies.save_dst.append(slot)
        # Synchronous scheduling: its block is cached now. (Where a snapshot of the prefix
        # appears meanwhile, the slot stays held this step: this step's save writes it.)
        self._key(request, rolling, ready=False)

    def publish_pending(self, request: Request) -> None:
        """Keys request's rolling snapshot where its block has become cached since it was
        saved (a step before: its save is launched, so it is found at once)."""
        rolling = self._held.get(request.req_id)
        if rolling is not None and rolling.block_hash is None:
            if self._key(request, rolling, ready=True) is False:
                del self._held[request.req_id]
                self.snapshots.release(rolling.slot)

    def release(self, request: Request) -> None:
        """request ends (finished or preempted; called after its blocks are freed, and cached
        where their tokens are known): a keyed snapshot stays as any other, an unkeyed one is
        keyed now where it can be, else its slot is freed."""
        rolling = self._held.pop(request.req_id, None)
        if rolling is not None and rolling.block_hash is None:
            if not self._key(request, rolling, ready=True):
                self.snapshots.release(rolling.slot)

    def _take_slot(self, request: Request) -> int:
        """request's rolling slot to overwrite (its own still, else a new one within the
        cap), or -1."""
        rolling = self._held.pop(request.req_id, None)
        if rolling is not None:
            if rolling.block_hash is None:
                return rolling.slot  # never keyed: nobody else has it
            if self.snapshots.take_back(rolling.block_hash, rolling.slot):
                return rolling.slot
            # Evicted since: the slot is not its own any more.
        if len(self._held) >= self.max_held:
            return -1
        return self.snapshots.hold()

    def _key(self, request: Request, rolling: _Rolling, ready: bool) -> bool | None:
        """Publishes rolling under its block's hash where the block is cached: True; False
        where a snapshot of that prefix is kept already (rolling's slot is not needed); None
        where the block is not cached (its last token not known yet)."""
        index = rolling.block_index
        if index >= len(request.block_hashes):
            return None
        block_id = self.blocks.cached_block_of(request, index)
        if block_id is None:
            return None
        block_hash = request.block_hashes[index]
        if not self.snapshots.publish(rolling.slot, block_hash, block_id, ready):
            return False
        rolling.block_hash = block_hash
        return True
