"""LoadBalancer: which data-parallel replica gets a new request (the one with the fewest
outstanding tokens), and the per-replica load kept up to date as outputs arrive."""

from __future__ import annotations

from minivllm.engine.types import EngineOutput


class LoadBalancer:
    """Pure bookkeeping (no processes, no locks): the caller serializes the calls.

    A request's cost is its prompt plus the tokens it may still generate, capped at
    max_model_len; each generated token lowers it by one, finishing or aborting removes it.
    """

    def __init__(self, num_replicas: int, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self.replica_of: dict[str, int] = {}  # req_id -> replica index, while unfinished
        self._outstanding: dict[str, int] = {}  # req_id -> tokens still to compute (estimate)
        self.load = [0] * num_replicas  # outstanding tokens per replica
        self.num_assigned = [0] * num_replicas  # requests ever sent to each replica

    def assign(self, req_id: str, num_prompt_tokens: int, max_tokens: int | None) -> int:
        """Picks the least loaded replica (the lowest index on ties) and charges it."""
        max_tokens = max_tokens if max_tokens is not None else self.max_model_len
        cost = min(num_prompt_tokens + max_tokens, self.max_model_len)
        index = self.least_loaded()
        self.replica_of[req_id] = index
        self._outstanding[req_id] = cost
        self.load[index] += cost
        self.num_assigned[index] += 1
        return index

    def least_loaded(self) -> int:
        """The replica with the fewest outstanding tokens (the lowest index on ties)."""
        return min(range(len(self.load)), key=lambda i: (self.load[i], i))

    def forget(self, req_id: str) -> int | None:
        """Drops a finished, aborted or rejected request; returns its replica (None if
        the request is not open here)."""
        index = self.replica_of.pop(req_id, None)
        if index is not None:
            self.load[index] -= self._outstanding.pop(req_id)
        return index

    def split_by_replica(self, req_ids: list[str]) -> dict[int, list[str]]:
        """The open ones of req_ids, grouped by replica, and forgotten (an abort)."""
        by_replica: dict[int, list[str]] = {}
        for req_id in req_ids:
            index = self.forget(req_id)
            if index is not None:
                by_replica.setdefault(index, []).append(req_id)
        return by_replica

    def update(self, index: int, outputs: list[EngineOutput]) -> list[EngineOutput]:
        """Accounts one step of replica `index`; returns the outputs of requests still open
        here (an aborted request's last tokens may still arrive: they are dropped)."""
        kept = [o for o in outputs if o.req_id in self.replica_of]
        for out in kept:
            if out.finished:
                self.forget(out.req_id)
            else:
                done = min(len(out.new_token_ids), self._outstanding[out.req_id])
                self._outstanding[out.req_id] -= done
                self.load[index] -= done
        return kept
