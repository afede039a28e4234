"""Recurrent-state snapshots of a hybrid model's prefix cache (no torch): which slots of the
runner's state pool hold the state after which cached prefix.

A snapshot is the linear-attention layers' state (conv + SSM) after the first n * block_size
tokens of some request, keyed by the chained hash of its block n - 1, the block that ends the
prefix. It lives while that block is cached (the attention KV of the prefix): a snapshot whose
block was evicted is dead, and its slot is the first taken for a new one; past that, the least
recently used snapshot goes. A snapshot saved in a step is written by that step's forward, so
it is found from the next step on. A slot may also be held for a snapshot whose key is not
known yet (a decoding request's, rolling_snapshots.py): no entry, nothing evicts it, until it
is published under its block's hash or released.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from minivllm.engine.sched.kv.block_manager import BlockManager


@dataclass
class _Snapshot:
    slot: int  # its slot in the runner's state pool
    block_id: int  # the cached block that ends its prefix
    ready: bool  # False during the step whose forward writes it


class SnapshotCache:
    """num_slots snapshot slots, first_slot onwards (after the running requests' slots)."""

    def __init__(self, blocks: BlockManager, first_slot: int, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_snapshot_slots must be at least 1, got {num_slots}")
        self.blocks = blocks
        self.num_slots = num_slots
        # block hash -> snapshot, least recently used first.
        self._entries: OrderedDict[int, _Snapshot] = OrderedDict()
        # Invariant: a slot is free <=> no entry holds it and it is not held (hold).
        self._free_slots = list(range(first_slot + num_slots - 1, first_slot - 1, -1))
        self._saved_this_step: list[_Snapshot] = []

    def __len__(self) -> int:
        return len(self._entries)

    def longest_hit(self, block_hashes: Sequence[int], block_ids: Sequence[int]) -> tuple[int, int]:
        """(n, slot): the most of block_ids (a cached prefix's blocks, block_hashes' first
        ones) whose end has a ready snapshot, and its slot; (0, -1) for none."""
        for n in range(len(block_ids), 0, -1):
            block_hash = block_hashes[n - 1]
            entry = self._entries.get(block_hash)
            if entry is not None and entry.ready and entry.block_id == block_ids[n - 1]:
                self._entries.move_to_end(block_hash)
                return n, entry.slot
        return 0, -1

    def saving_after(self, block_hashes: Sequence[int], first: int, end: int) -> bool:
        """Whether this step saves a snapshot of a prefix ending at one of blocks first..end - 1
        (block_hashes' indices): found from the next step on."""
        for block_hash in block_hashes[first:end]:
            entry = self._entries.get(block_hash)
            if entry is not None and not entry.ready:
                return True
        return False

    def reserve(self, block_hash: int, block_id: int) -> int:
        """The slot a new snapshot of the prefix ending at cached block block_id (hash
        block_hash) is saved into this step, or -1: one lives already, or every slot holds a
        snapshot saved this step."""
        entry = self._entries.get(block_hash)
        if entry is not None and self._is_live(block_hash, entry):
            return -1
        if entry is None:
            slot = self._free_slot()
            if slot < 0:
                return -1
            entry = self._entries[block_hash] = _Snapshot(slot, block_id, False)
        entry.block_id, entry.ready = block_id, False
        self._entries.move_to_end(block_hash)
        self._saved_this_step.append(entry)
        return entry.slot

    def has_live(self, block_hash: int) -> bool:
        """Whether a snapshot of the prefix ending at the block of block_hash is kept (ready
        or saved this step) while that block is cached."""
        entry = self._entries.get(block_hash)
        return entry is not None and self._is_live(block_hash, entry)

    def hold(self) -> int:
        """A slot for a snapshot whose key comes later (publish), or -1 (as reserve's)."""
        return self._free_slot()

    def publish(self, slot: int, block_hash: int, block_id: int, ready: bool) -> bool:
        """Makes held slot the snapshot of the prefix ending at cached block block_id (hash
        block_hash): found at once where ready (its save is launched already), else from the
        next step on. False, changing nothing, where a snapshot of that prefix is live or
        saved this step."""
        entry = self._entries.get(block_hash)
        if entry is not None:
            if not entry.ready or self._is_live(block_hash, entry):
                return False
            self._free_slots.append(self._entries.pop(block_hash).slot)  # dead: replaced
        entry = self._entries[block_hash] = _Snapshot(slot, block_id, ready)
        if not ready:
            self._saved_this_step.append(entry)
        return True

    def take_back(self, block_hash: int, slot: int) -> bool:
        """Holds slot again where it is still the ready snapshot of block_hash (its entry
        goes: the slot is to be overwritten); False where it is not."""
        entry = self._entries.get(block_hash)
        if entry is None or entry.slot != slot or not entry.ready:
            return False
        del self._entries[block_hash]
        return True

    def release(self, slot: int) -> None:
        """Frees a held slot."""
        self._free_slots.append(slot)

    def end_step(self) -> None:
        """The step's snapshots are written by its forward: found from the next step on."""
        for entry in self._saved_this_step:
            entry.ready = True
        self._saved_this_step.clear()

    def _is_live(self, block_hash: int, entry: _Snapshot) -> bool:
        return self.blocks.cached_block(block_hash) == entry.block_id

    def _free_slot(self) -> int:
        """A free slot, else the slot of a dead snapshot, else of the least recently used
        one; -1 when every snapshot was saved this step."""
        if self._free_slots:
            return self._free_slots.pop()
        victim = None
        for block_hash, entry in self._entries.items():
            if not entry.ready:
                continue
            if not self._is_live(block_hash, entry):
                victim = block_hash
                break
            if victim is None:
                victim = block_hash
        if victim is None:
            return -1
        return self._entries.pop(victim).slot
