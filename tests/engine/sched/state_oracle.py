"""A fake runner of a hybrid model's steps for scheduler tests: per state slot, the tokens its
recurrent state has consumed. It applies a step's restores before its chunks and its saves
after them, and checks that every chunk continues exactly the state of its request's earlier
tokens (a hit's restored snapshot included)."""

from __future__ import annotations

import random

from minivllm.engine.sched.request import Request
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.engine.types import PLACEHOLDER_TOKEN_ID, RunnerOutput, SchedulerOutput


class StateOracle:
    """The runner's view: slot -> the tokens its state has consumed; samples random tokens
    below vocab."""

    def __init__(self, seed: int, vocab: int) -> None:
        self.rng = random.Random(seed)
        self.vocab = vocab
        self.slots: dict[int, tuple[int, ...]] = {}
        self.sampled: dict[tuple[str, int], int] = {}  # (req_id, position) -> token
        self.num_hits = 0

    def run(self, sched_out: SchedulerOutput, scheduler: Scheduler) -> RunnerOutput:
        copies = sched_out.state_copies
        if copies is not None:
            self._copy(copies.restore_src, copies.restore_dst)
        req_ids, tokens = [], []
        for chunk in sched_out.chunks:
            request = scheduler.get_request(chunk.req_id)
            start = chunk.num_computed_tokens
            state = self.slots.get(chunk.state_slot, ()) if start else ()
            expected = tuple(self._token(request, i) for i in range(start))
            assert state == expected, f"{chunk.req_id}: its state is not its tokens before {start}"
            new = [self._token(request, start + i) if t == PLACEHOLDER_TOKEN_ID else t
                   for i, t in enumerate(chunk.token_ids)]  # fmt: skip
            self.slots[chunk.state_slot] = state + tuple(new)
            if chunk.sample:
                req_ids.append(chunk.req_id)
                tokens.append(self.rng.randrange(self.vocab))
                self.sampled[(chunk.req_id, chunk.context_end)] = tokens[-1]
        if copies is not None:
            self._copy(copies.save_src, copies.save_dst)
            self.num_hits += len(copies.restore_src)
        return RunnerOutput(req_ids, tokens)

    def _token(self, request: Request, position: int) -> int:
        if position < request.num_tokens:
            return request.all_token_ids[position]
        return self.sampled[(request.req_id, position)]  # pending: sampled, not applied yet

    def _copy(self, src: list[int], dst: list[int]) -> None:
        assert len(set(dst)) == len(dst) and not set(src) & set(dst)
        for s, d in zip(src, dst, strict=True):
            self.slots[d] = self.slots[s]


class Pending:
    """A launched step's output (async scheduling's update takes one)."""

    def __init__(self, out: RunnerOutput) -> None:
        self.out = out

    def result(self) -> RunnerOutput:
        return self.out


def oracle_step(scheduler: Scheduler, oracle: StateOracle, is_async: bool) -> SchedulerOutput:
    """One step of scheduler through oracle; under async scheduling the step stays in flight."""
    sched_out = scheduler.schedule()
    out = oracle.run(sched_out, scheduler)
    scheduler.update(sched_out, Pending(out) if is_async and not sched_out.is_empty else out)
    return sched_out
