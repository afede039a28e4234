"""RoutedExpertsRecorder on hand-made steps (blocks of 4): an output reads the routing of its
request's positions where the step being applied had their KV, also when the request was
preempted since (async scheduling: its blocks freed and handed out before its step is
applied), and a prefix hit reads the cached tokens' routing from the cache's blocks."""

from __future__ import annotations

import numpy as np

from minivllm.engine.sched.request import Request
from minivllm.engine.sched.routed_experts import RoutedExpertsRecorder
from minivllm.engine.types import RoutedExpertsSpec, ScheduledChunk, SchedulerOutput, StepRouting
from minivllm.sampling_params import SamplingParams

BLOCK = 4
SPEC = RoutedExpertsSpec(num_layers=2, top_k=3, num_experts=64)


def rows_for(tag: int, positions: range) -> np.ndarray:
    """Distinct rows: expert ids tag, position, layer * 3 + k."""
    out = np.zeros((len(positions), SPEC.num_layers, SPEC.top_k), np.uint8)
    for i, p in enumerate(positions):
        out[i] = np.arange(SPEC.num_layers * SPEC.top_k).reshape(2, 3) + 10 * p + tag
    return out


def step(
    recorder: RoutedExpertsRecorder,
    requests: dict[str, Request],
    chunks: list[tuple[Request, int, int, list[int], int, bool]],
    tag: int,
) -> None:
    """Records one step: chunks of (request, first position, tokens, new blocks, prior
    blocks, sample), each row tagged with its request's tag and position; the slots are the
    blocks' (the runner's slot mapping)."""
    sched_chunks, rows, slots = [], [], []
    tables: dict[str, list[int]] = {}
    for request, start, n, new_blocks, prior, sample in chunks:
        table = tables.setdefault(request.req_id, request.block_ids[:prior] + new_blocks)
        sched_chunks.append(
            ScheduledChunk(request.req_id, [1] * n, start, new_blocks, prior, sample)
        )
        positions = range(start, start + n)
        rows.append(rows_for(tag, positions))
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in positions]
        request.block_ids = table
    sched_out = SchedulerOutput(sched_chunks, 0)
    routing = StepRouting(np.concatenate(rows), np.asarray(slots, np.int64))
    recorder.record(sched_out, routing, requests)


def new_request(req_id: str, num_prompt_tokens: int) -> Request:
    return Request(req_id, list(range(1, num_prompt_tokens + 1)), SamplingParams(), 0.0)


def test_preempted_request_reads_the_blocks_its_step_had() -> None:
    recorder = RoutedExpertsRecorder(SPEC, num_blocks=8, block_size=BLOCK)
    r, s = new_request("r", 6), new_request("s", 8)
    requests = {"r": r, "s": s}
    step(recorder, requests, [(r, 0, 4, [3], 0, False)], tag=0)  # a first chunk, block 3
    step(recorder, requests, [(r, 4, 2, [5], 1, True)], tag=0)  # the rest: it samples
    # Preempted before that step is applied: its blocks go to s in the next step.
    r.block_ids = []
    r.append_output_token(9)
    got = recorder.take(r)
    np.testing.assert_array_equal(got, rows_for(0, range(6)))  # all 6 forwarded positions
    step(recorder, requests, [(s, 0, 8, [3, 5], 0, True)], tag=100)  # s overwrites them
    s.append_output_token(9)
    np.testing.assert_array_equal(recorder.take(s), rows_for(100, range(8)))
    # r, recomputed after the preemption (blocks 6, 7): its next output carries only the
    # position that is new, the one of its first output token.
    step(recorder, requests, [(r, 0, 7, [6, 7], 0, True)], tag=200)
    r.append_output_token(9)
    np.testing.assert_array_equal(recorder.take(r), rows_for(200, range(6, 7)))


def test_prefix_hit_reads_the_cached_blocks() -> None:
    recorder = RoutedExpertsRecorder(SPEC, num_blocks=8, block_size=BLOCK)
    a, b = new_request("a", 9), new_request("b", 10)
    requests = {"a": a, "b": b}
    step(recorder, requests, [(a, 0, 9, [1, 2, 4], 0, True)], tag=0)
    a.append_output_token(9)
    np.testing.assert_array_equal(recorder.take(a), rows_for(0, range(9)))
    # b shares a's first 8 tokens: blocks 1 and 2 hit, it computes positions 8 and 9.
    step(recorder, requests, [(b, 8, 2, [1, 2, 5], 0, True)], tag=50)
    b.append_output_token(9)
    expected = np.concatenate([rows_for(0, range(8)), rows_for(50, range(8, 10))])
    np.testing.assert_array_equal(recorder.take(b), expected)
    # A decode step: one more position, from the step's own rows.
    step(recorder, requests, [(b, 10, 1, [], 3, True)], tag=70)
    b.append_output_token(9)
    np.testing.assert_array_equal(recorder.take(b), rows_for(70, range(10, 11)))


def test_finished_and_aborted_requests_are_forgotten() -> None:
    recorder = RoutedExpertsRecorder(SPEC, num_blocks=4, block_size=BLOCK)
    a, b = new_request("a", 3), new_request("b", 3)
    requests = {"a": a, "b": b}
    step(recorder, requests, [(a, 0, 3, [0], 0, True), (b, 0, 3, [1], 0, True)], tag=0)
    a.append_output_token(9)
    a.finish_reason = "length"
    assert recorder.take(a).shape == (3, 2, 3)
    recorder.forget("b")  # aborted
    assert not recorder._tracked
    assert recorder.nbytes == 4 * BLOCK * 2 * 3
