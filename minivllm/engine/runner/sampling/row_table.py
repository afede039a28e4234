"""The requests' sampling parameters as numpy columns, one row (a slot) per request, written
once when the request arrives: a step gathers its rows' values with a few numpy calls, where a
Python pass over its rows costs about a microsecond a row (a millisecond a step at 1,024 rows,
the host's share of a decode step of a small model)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minivllm.engine.runner.sampling.request_state import FLOAT_PARAMS, RequestState


@dataclass
class StepRows:
    """A step's rows' values, gathered from a RowTable (N rows)."""

    floats: np.ndarray  # [N, len(FLOAT_PARAMS)] float32
    top_k: np.ndarray  # [N] int64, 0 = off
    top_p: np.ndarray  # [N] float64 (the params' own values: the filters' flags read them)
    min_p: np.ndarray  # [N] float64
    random: np.ndarray  # [N] bool: not greedy
    penalized: np.ndarray  # [P] int64: the rows with penalties
    logprob_rows: np.ndarray  # [R] int64: the rows that ask for logprobs
    num_logprobs: np.ndarray  # [R] int64: how many each asks for
    banned_until: np.ndarray  # [N] int64: min_tokens where it bans some id, else 0
    seeded: np.ndarray  # [N] bool: with a seed
    seed: np.ndarray  # [N] int64: the seed (0 where none)
    edited: bool  # some row has a logit_bias or allowed_token_ids


class RowTable:
    """Slots of requests' sampling parameters; grows by doubling."""

    def __init__(self, capacity: int = 64) -> None:
        self._free: list[int] = []  # slots given back, reused first
        self._used = 0  # slots handed out at least once: 0 .. _used - 1
        self._columns: dict[str, np.ndarray] = {}
        self._grow(max(1, capacity))

    def _grow(self, capacity: int) -> None:
        specs = {
            "floats": ((len(FLOAT_PARAMS),), np.float32),
            "top_k": ((), np.int64),
            "top_p": ((), np.float64),
            "min_p": ((), np.float64),
            "random": ((), np.bool_),
            "penalized": ((), np.bool_),
            "num_logprobs": ((), np.int64),
            "banned_until": ((), np.int64),
            "seeded": ((), np.bool_),
            "seed": ((), np.int64),
            "edited": ((), np.bool_),
        }
        old = self._columns
        self._columns = {
            name: np.zeros((capacity, *shape), dtype) for name, (shape, dtype) in specs.items()
        }
        for name, column in old.items():
            self._columns[name][: len(column)] = column

    def add(self, state: RequestState) -> int:
        """Writes state's parameters into a free slot; returns the slot."""
        if self._free:
            slot = self._free.pop()
        else:
            slot = self._used
            self._used += 1
            if slot == len(self._columns["top_k"]):
                self._grow(2 * slot)
        p, c = state.params, self._columns
        c["floats"][slot] = [getattr(p, name) for name in FLOAT_PARAMS.values()]
        c["top_k"][slot] = p.top_k
        c["top_p"][slot] = p.top_p
        c["min_p"][slot] = p.min_p
        c["random"][slot] = state.is_random
        c["penalized"][slot] = state.has_penalties
        c["num_logprobs"][slot] = -1 if p.logprobs is None else p.logprobs
        c["banned_until"][slot] = p.min_tokens if state.banned_early else 0
        c["seeded"][slot] = p.seed is not None
        c["seed"][slot] = 0 if p.seed is None else p.seed
        c["edited"][slot] = bool(p.logit_bias) or bool(p.allowed_token_ids)
        return slot

    def remove(self, slot: int) -> None:
        self._free.append(slot)

    def gather(self, slots: np.ndarray) -> StepRows:
        """The values of the rows whose requests hold slots [N] int64 (a request may hold
        several rows: a drafted step's positions)."""
        c = self._columns
        num_logprobs = c["num_logprobs"][slots]
        logprob_rows = np.flatnonzero(num_logprobs >= 0)
        return StepRows(
            floats=c["floats"][slots],
            top_k=c["top_k"][slots],
            top_p=c["top_p"][slots],
            min_p=c["min_p"][slots],
            random=c["random"][slots],
            penalized=np.flatnonzero(c["penalized"][slots]),
            logprob_rows=logprob_rows,
            num_logprobs=num_logprobs[logprob_rows],
            banned_until=c["banned_until"][slots],
            seeded=c["seeded"][slots],
            seed=c["seed"][slots],
            edited=bool(c["edited"][slots].any()),
        )
