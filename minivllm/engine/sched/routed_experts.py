"""RoutedExpertsRecorder (enable_return_routed_experts): the routed experts of every KV slot,
on the host, so that a request's routing follows its KV. A prefix-cache hit reads the routing
of the cached tokens where their KV is, and a preempted request's recomputed tokens write
theirs again. Each output carries the rows of the positions forwarded since the last one."""

from __future__ import annotations

import numpy as np

from minivllm.engine.sched.request import Request
from minivllm.engine.types import RoutedExpertsSpec, SchedulerOutput, StepRouting


class _Tracked:
    """A request's block table as of the step being applied, and how many of its positions'
    routing its outputs have carried."""

    __slots__ = ("block_ids", "num_sent", "rows", "row_start", "first_position")

    def __init__(self) -> None:
        self.block_ids: list[int] = []
        self.num_sent = 0
        # Its chunk of the step being applied: the step's rows, where the chunk's rows start,
        # the chunk's first position (rows is None: no chunk this step).
        self.rows: np.ndarray | None = None
        self.row_start = 0
        self.first_position = 0


class RoutedExpertsRecorder:
    """store[slot] = the routed experts [num_layers, top_k] of the token whose KV is at slot
    (slot = block_id * block_size + offset), as the last applied step wrote it.

    Why per slot: a slot's routing and its KV are written by the same forward, so whatever
    KV a request attends to (its own, a prefix hit's, a recomputation's), the routing read at
    the same slots is the one that produced it. The store holds what steps up to the one being
    applied wrote: a block freed and handed out again is written by a later step, so the
    tables taken from the step being applied (record) read the right rows.
    """

    def __init__(self, spec: RoutedExpertsSpec, num_blocks: int, block_size: int) -> None:
        shape = (num_blocks * block_size, spec.num_layers, spec.top_k)
        self.store = np.zeros(shape, spec.dtype)
        self.block_size = block_size
        self._tracked: dict[str, _Tracked] = {}

    @property
    def nbytes(self) -> int:
        return self.store.nbytes

    def record(
        self, sched_out: SchedulerOutput, routing: StepRouting, requests: dict[str, Request]
    ) -> None:
        """Stores a step's rows at their slots and takes the block tables of its unfinished
        requests as the step had them (a request preempted since keeps the blocks its
        routing is in until it is scheduled again)."""
        self.store[routing.slot_mapping] = routing.rows
        row_start = 0
        for chunk in sched_out.chunks:
            request = requests.get(chunk.req_id)
            if request is not None and not request.is_finished:
                tracked = self._tracked.get(chunk.req_id)
                if tracked is None:
                    tracked = self._tracked[chunk.req_id] = _Tracked()
                if chunk.num_prior_blocks != len(tracked.block_ids) or chunk.new_block_ids:
                    del tracked.block_ids[chunk.num_prior_blocks :]
                    tracked.block_ids += chunk.new_block_ids
                if chunk.sample:  # take() reads the rows in this update
                    tracked.rows, tracked.row_start = routing.rows, row_start
                    tracked.first_position = chunk.num_computed_tokens
            row_start += len(chunk.token_ids)

    def take(self, request: Request) -> np.ndarray:
        """The routing of request's positions forwarded since its last output, up to its last
        token but one (the last is not forwarded yet): [n, num_layers, top_k]. Called once
        its step's tokens are appended; a finished request is forgotten."""
        tracked = self._tracked[request.req_id]
        start, end = tracked.num_sent, request.num_tokens - 1
        tracked.num_sent = max(end, start)
        if request.is_finished:
            del self._tracked[request.req_id]
        first = tracked.first_position
        if tracked.rows is not None and start >= first:  # all forwarded by this step
            offset = tracked.row_start - first
            out = tracked.rows[offset + start : offset + end].copy()
        else:  # earlier chunks, a prefix hit
            out = self.store[self._slots(tracked.block_ids, start, end)]
        tracked.rows = None  # the step's rows are not kept past it
        return out

    def forget(self, req_id: str) -> None:
        """Drops an aborted request."""
        self._tracked.pop(req_id, None)

    def _slots(self, block_ids: list[int], start: int, end: int) -> np.ndarray:
        """The KV slots of positions [start, end) of a request with block_ids."""
        size = self.block_size
        first = start // size
        blocks = np.asarray(block_ids[first : -(-end // size)], np.int64)
        positions = np.arange(start, end)
        return blocks[positions // size - first] * size + positions % size
