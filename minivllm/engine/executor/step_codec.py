"""The messages rank 0 broadcasts to tensor-parallel workers, and their compact encoding.

A step travels as tuples of ints, strings and lists (pickled: C speed, no per-object class
records): about half the bytes and a third of the time of pickling the dataclasses. A
constrained step carries its mask's rows; the mask follows (engine/executor/step_mask.py).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from enum import IntEnum
from typing import Any

from minivllm.engine.types import ScheduledChunk, SchedulerOutput
from minivllm.structured_output.bitmask import StepMask


class Op(IntEnum):
    EXECUTE = 0  # run the step, wait for its tokens (tp_worker.serve_steps: runner.execute)
    EXECUTE_ASYNC = 1  # launch the step; its tokens are collected at the next message
    SHUTDOWN = 2


def encode(op: Op, sched_out: SchedulerOutput | None = None) -> bytes:
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
        )
        for c in sched_out.chunks
    ]
    body = (chunks, sched_out.num_decode_chunks, sched_out.new_requests, sched_out.finished_req_ids)
    return pickle.dumps((int(op), body, mask_rows(sched_out)), protocol=5)


def mask_rows(sched_out: SchedulerOutput) -> list[int] | None:
    """The constrained rows of a step (None: unconstrained, nothing more is sent)."""
    mask = sched_out.structured_output
    return None if mask is None else list(mask.rows)


def decode(
    data: bytes, expect_mask: Callable[[list[int]], StepMask] | None = None
) -> tuple[Op, SchedulerOutput | None]:
    """expect_mask(rows): the StepMask of a constrained step (step_mask.MaskReceiver.expect),
    set as its structured_output."""
    op, body, rows = pickle.loads(data)
    if body is None:
        return Op(op), None
    chunks, num_decode_chunks, new_requests, finished_req_ids = body
    sched_out = SchedulerOutput(
        chunks=[ScheduledChunk(*c) for c in chunks],
        num_decode_chunks=num_decode_chunks,
        new_requests=new_requests,
        finished_req_ids=finished_req_ids,
    )
    if rows is not None:
        if expect_mask is None:
            raise ValueError("a constrained step needs expect_mask to receive its mask")
        sched_out.structured_output = expect_mask(rows)
    return Op(op), sched_out


def encode_error(exc: BaseException, traceback_text: str) -> bytes:
    """A worker's startup error, for its status pipe."""
    return pickle.dumps(("error", f"{type(exc).__name__}: {exc}", traceback_text))


def status_message(data: bytes) -> tuple[str, Any, Any]:
    return pickle.loads(data)
