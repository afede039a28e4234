"""The messages rank 0 broadcasts to tensor-parallel workers, and their compact encoding.

A step travels as tuples of ints, strings and lists (pickled: C speed, no per-object class
records): about half the bytes and a third of the time of pickling the dataclasses. On a
hybrid model it carries each chunk's recurrent-state slot and the step's state copies (prefix
snapshots restored and saved): every rank keeps the states of its own heads in the same
slots, so every rank applies the same copies. A step
is two messages, as on rank 0 two calls: FORWARD, then SAMPLE with the step's grammar rows
(the bitmask follows them: engine/executor/step_mask.py).
"""

from __future__ import annotations

import pickle
from enum import IntEnum
from typing import Any, NamedTuple

from minivllm.engine.types import GrammarOutput, ScheduledChunk, SchedulerOutput, StateCopies


class Op(IntEnum):
    FORWARD = 0  # launch the step's forward (tp_worker.serve_steps: runner.forward)
    SAMPLE = 1  # sample the launched forward and wait for its tokens
    SAMPLE_ASYNC = 2  # sample it; its tokens are collected at the next sample
    SHUTDOWN = 3
    # FORWARD after collecting the step in flight: rank 0 read it to fill the step's draft
    # slots (engine/runner/drafts/draft_slots.py), and its sampling state must be every rank's
    FORWARD_AFTER_READ = 4


class Message(NamedTuple):
    op: Op
    sched_out: SchedulerOutput | None  # FORWARD's step
    grammar_rows: list[int] | None  # a SAMPLE's constrained rows: the bitmask follows


def encode(op: Op, sched_out: SchedulerOutput | None = None) -> bytes:
    """FORWARD (with its step) or SHUTDOWN."""
    if sched_out is None:
        return pickle.dumps((int(op), None, None), protocol=5)
    chunks = [
        (
            c.req_id,
            c.token_ids,
            c.num_computed_tokens,
            c.new_block_ids,
            c.num_prior_blocks,
            c.sample,
            c.num_draft_tokens,
            c.state_slot,
            c.draft_cap,
            c.draft_state_slots,
        )
        for c in sched_out.chunks
    ]
    copies = sched_out.state_copies
    body = (
        chunks,
        sched_out.num_decode_chunks,
        sched_out.new_requests,
        sched_out.finished_req_ids,
        sched_out.preempted_req_ids,
        None
        if copies is None
        else (copies.restore_src, copies.restore_dst, copies.save_src, copies.save_dst),
    )
    return pickle.dumps((int(op), body, None), protocol=5)


def encode_sample(op: Op, grammar: GrammarOutput | None) -> bytes:
    """SAMPLE or SAMPLE_ASYNC; with a grammar output, its rows (the bitmask is sent next, as
    raw bytes: engine/executor/step_mask.py)."""
    rows = None if grammar is None else list(grammar.rows)
    return pickle.dumps((int(op), None, rows), protocol=5)


def decode(data: bytes) -> Message:
    op, body, rows = pickle.loads(data)
    if body is None:
        return Message(Op(op), None, rows)
    chunks, num_decode_chunks, new_requests, finished_req_ids, preempted_req_ids, copies = body
    sched_out = SchedulerOutput(
        chunks=[ScheduledChunk(*c) for c in chunks],
        num_decode_chunks=num_decode_chunks,
        new_requests=new_requests,
        finished_req_ids=finished_req_ids,
        preempted_req_ids=preempted_req_ids,
        state_copies=None if copies is None else StateCopies(*copies),
    )
    return Message(Op(op), sched_out, None)


def encode_error(exc: BaseException, traceback_text: str) -> bytes:
    """A worker's startup error, for its status pipe."""
    return pickle.dumps(("error", f"{type(exc).__name__}: {exc}", traceback_text))


def status_message(data: bytes) -> tuple[str, Any, Any]:
    return pickle.loads(data)
