"""The KV cache's bookkeeping over its layer groups: the paged blocks of the attention layers
(BlockManager) and, in a hybrid model, one recurrent-state slot per running request for the
linear-attention layers. The scheduler's allocate / free stay one call each.

A slot is taken when a request is first given blocks and given back when it finishes or is
preempted: preemption recomputes, so the request's next chunk starts from a fresh state.
Prefix-cache hits are off for hybrid models: a hit would need the recurrent state at the hit's
end, which is not kept; get_computed_blocks finds none.
"""

from __future__ import annotations

import logging

from minivllm.engine.sched.block_manager import BlockManager
from minivllm.engine.sched.request import Request

logger = logging.getLogger(__name__)


class HybridKVCoordinator:
    """BlockManager's interface over the paged blocks and num_state_slots state slots."""

    def __init__(self, num_blocks: int, block_size: int, num_state_slots: int) -> None:
        if num_state_slots < 1:
            raise ValueError(f"num_state_slots must be at least 1, got {num_state_slots}")
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self.num_state_slots = num_state_slots
        # Invariant: a slot is free <=> no request's state_slot holds it. Lowest first.
        self._free_slots = list(range(num_state_slots - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return self.blocks.num_free_blocks

    @property
    def num_free_state_slots(self) -> int:
        return len(self._free_slots)

    @property
    def usage(self) -> float:
        return self.blocks.usage

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """No prefix-cache hit: ([], 0)."""
        return [], 0

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed_blocks: list[int] | None = None
    ) -> list[int] | None:
        """BlockManager.allocate_slots, and a state slot for a request without one; None,
        changing nothing, when either runs out."""
        needs_slot = request.state_slot < 0
        if needs_slot and not self._free_slots:
            return None
        new_block_ids = self.blocks.allocate_slots(request, num_new_tokens, computed_blocks)
        if new_block_ids is not None and needs_slot:
            request.state_slot = self._free_slots.pop()
        return new_block_ids

    def free(self, request: Request) -> None:
        """Drops request's blocks and gives its state slot back."""
        self.blocks.free(request)
        if request.state_slot >= 0:
            self._free_slots.append(request.state_slot)
            request.state_slot = -1

    def trim(self, request: Request, num_tokens: int) -> None:
        self.blocks.trim(request, num_tokens)


def make_kv_coordinator(
    num_blocks: int, block_size: int, enable_prefix_caching: bool, num_state_slots: int
) -> BlockManager | HybridKVCoordinator:
    """The BlockManager of a model with attention layers only (num_state_slots 0); else the
    hybrid coordinator over num_state_slots slots (as many as the runner's state pool has)."""
    if not num_state_slots:
        return BlockManager(num_blocks, block_size, enable_prefix_caching)
    if enable_prefix_caching:
        logger.info(
            "prefix caching finds no hits on hybrid models: a hit needs the recurrent state at "
            "its end, which is not kept"
        )
    return HybridKVCoordinator(num_blocks, block_size, num_state_slots)
