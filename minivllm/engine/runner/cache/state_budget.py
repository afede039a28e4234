"""The recurrent-state pool's share of a hybrid model's cache budget: how many running slots
and prefix-snapshot slots go with a number of KV blocks, and the most blocks that fit a budget
beside them. The runner (allocating) and the engine core (the KV coordinator's slots) both
derive the counts from the number of blocks with state_budget_for.

The paged KV and the state pool share one budget. Every running request holds a slot, so the
slots bound the scheduler's seats: max_num_seqs of them where they take at most a third of
the KV's bytes, fewer where they would take more, so that long contexts keep their KV. With
prefix caching (not in deterministic mode), snapshots (the state after a cached prefix) take
up to an eighth of the KV's bytes more. A snapshot costs as much as many tokens of KV, so a
long prompt's snapshots every snapshot_interval tokens are as far apart as the tokens whose KV
takes eight snapshots' bytes: kept for every prefix the KV holds, they would fill that eighth.
With speculative decoding, draft-state slots hold the states after each draft of a verify step
(engine/sched/kv/draft_states.py): k for each request that may draft at once (the running slots,
at most disable_by_batch_size of them: no step speculates with more), within the running
slots' share of the KV's bytes again; a step's drafts are as many as free draft-state slots.
"""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.engine.runner.cache.kv_cache import KVCacheSpec
from minivllm.engine.runner.cache.state_cache import RecurrentStateSpec
from minivllm.engine.setup import EngineSetup

# Snapshots take at most 1 / SNAPSHOT_SHARE of the KV's bytes, running slots 1 / RUNNING_SHARE.
SNAPSHOT_SHARE = 8
RUNNING_SHARE = 3


@dataclass(frozen=True)
class StateBudget:
    """The state pool that goes with some number of KV blocks (all 0: no linear attention)."""

    num_state_slots: int  # one per running request
    num_snapshot_slots: int  # prefix-cache snapshots, after the running slots in the pool
    snapshot_interval: int  # tokens between a long prompt's interval snapshots (blocks' multiple)
    num_draft_state_slots: int = 0  # the states after a verify step's drafts, after the snapshots

    @property
    def num_pool_slots(self) -> int:
        return self.num_state_slots + self.num_snapshot_slots + self.num_draft_state_slots


def _specs(setup: EngineSetup) -> tuple[KVCacheSpec, RecurrentStateSpec | None]:
    tp_size = setup.config.tensor_parallel_size
    kv = KVCacheSpec.for_model(
        setup.model_config, setup.config.block_size, setup.kv_cache_dtype, setup.device, tp_size
    )
    # One rank's bytes of both: the budget is a rank's (every rank holds the same counts).
    states = RecurrentStateSpec.for_model(setup.model_config, setup.dtype, setup.device, tp_size)
    return kv, states


def _budget(
    num_blocks: int, kv: KVCacheSpec, states: RecurrentStateSpec, setup: EngineSetup
) -> StateBudget:
    seats = setup.limits.max_num_seqs
    kv_bytes, slot_bytes = num_blocks * kv.bytes_per_block, states.bytes_per_slot
    if setup.config.num_gpu_blocks_override is not None:  # the budget sidestepped
        running, snapshots = seats, seats
    else:
        running = max(1, min(seats, kv_bytes // (RUNNING_SHARE * slot_bytes)))
        snapshots = kv_bytes // (SNAPSHOT_SHARE * slot_bytes)
    if not setup.config.enable_prefix_caching or setup.config.deterministic:
        # Deterministic mode: a hit (and the chunk it ends at a snapshot) would change where
        # the rule's chunks fall, which rounds a request's bits by its cache's history.
        snapshots = 0
    interval_blocks = -(-SNAPSHOT_SHARE * slot_bytes // kv.bytes_per_block)
    drafts = _draft_state_slots(setup, running, kv_bytes // (RUNNING_SHARE * slot_bytes))
    return StateBudget(running, snapshots, interval_blocks * setup.config.block_size, drafts)


def _draft_state_slots(setup: EngineSetup, running: int, max_slots: int) -> int:
    """The draft-state slots beside running state slots: k for each request that may draft at once,
    at most max_slots (all of them where the budget is sidestepped); 0 without speculation."""
    spec = setup.config.speculative_config
    if spec is None:
        return 0
    drafting = min(running, spec.disable_by_batch_size or running)
    wanted = spec.num_speculative_tokens * drafting
    if setup.config.num_gpu_blocks_override is not None:
        return wanted
    return min(wanted, max_slots)


def state_budget_for(setup: EngineSetup, num_blocks: int) -> StateBudget:
    """The state pool that goes with num_blocks KV blocks."""
    kv, states = _specs(setup)
    if states is None:
        return StateBudget(0, 0, 0)
    return _budget(num_blocks, kv, states, setup)


def blocks_for_budget(setup: EngineSetup, budget_bytes: int) -> int:
    """The most KV blocks that fit budget_bytes beside their state pool (state_budget_for)."""
    kv, states = _specs(setup)
    if states is None:
        return kv.num_blocks_for(budget_bytes)
    lo, hi = 0, max(0, budget_bytes // kv.bytes_per_block)
    while lo < hi:  # the bytes grow with the blocks: the largest count that fits
        mid = (lo + hi + 1) // 2
        pool = _budget(mid, kv, states, setup).num_pool_slots
        used = mid * kv.bytes_per_block + pool * states.bytes_per_slot
        lo, hi = (mid, hi) if used <= budget_bytes else (lo, mid - 1)
    return lo
