"""A constrained step's grammar output under TP, without processes: the SAMPLE message carries
its rows, the bitmask rank 0's scheduler filled goes through the ring as the next message and
comes out equal on a worker, an unconstrained step sends nothing more, a received mask stays
intact while the next ones arrive, and a worker's runner samples under it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.engine.executor.shm_ring import ShmRing
from minivllm.engine.executor.step_codec import Op, decode, encode
from minivllm.engine.executor.step_mask import GrammarReceiver, send_sample
from minivllm.engine.types import GrammarOutput, NewRequestData, ScheduledChunk, SchedulerOutput
from minivllm.structured_output.bitmask import allocate_bitmask


def filled(rows: list[int], num_words: int, seed: int) -> GrammarOutput:
    """A grammar output standing in for the scheduler's: random words."""
    rng = np.random.default_rng(seed)
    words = rng.integers(-(2**31), 2**31 - 1, (len(rows), num_words), dtype=np.int32)
    return GrammarOutput(rows, words)


@pytest.fixture
def ring_pair():
    # Small slots: a mask spans several of them (a step with new requests, several more).
    writer = ShmRing.create(num_readers=1, num_slots=8, slot_bytes=256)
    reader = ShmRing.attach(writer.handle, 0)
    yield writer, reader
    reader.close()
    writer.close()


def step() -> SchedulerOutput:
    chunks = [ScheduledChunk(str(i), [7 + i], 3, [], 1, True) for i in range(4)]
    return SchedulerOutput(chunks, 4)


def receive_sample(reader, receiver: GrammarReceiver) -> tuple[Op, GrammarOutput | None]:
    """What a worker does with a SAMPLE message: reads the bitmask after it, if any."""
    op, sched_out, rows = decode(reader.read())
    assert sched_out is None
    return op, None if rows is None else receiver.receive(rows)


def test_constrained_sample_then_its_mask_arrive_equal(ring_pair) -> None:
    writer, reader = ring_pair
    receiver = GrammarReceiver(reader.read, max_rows=4, pin_memory=False)
    grammar = filled([1, 3], num_words=40, seed=0)  # 320 bytes: two slots
    writer.write(encode(Op.FORWARD, step()))
    op, sched_out, rows = decode(reader.read())
    assert op == Op.FORWARD and sched_out == step() and rows is None
    send_sample(writer.write, Op.SAMPLE_ASYNC, grammar)  # rank 0, once its mask is filled
    op, received = receive_sample(reader, receiver)  # a worker
    assert op == Op.SAMPLE_ASYNC and received.rows == [1, 3]
    assert received.bitmask.dtype == np.int32
    assert np.array_equal(received.bitmask, grammar.bitmask)


def test_unconstrained_step_sends_no_mask(ring_pair) -> None:
    writer, reader = ring_pair
    receiver = GrammarReceiver(reader.read, max_rows=4, pin_memory=False)
    send_sample(writer.write, Op.SAMPLE, None)
    writer.write(encode(Op.SHUTDOWN))
    assert receive_sample(reader, receiver) == (Op.SAMPLE, None)
    assert decode(reader.read()) == (Op.SHUTDOWN, None, None)


def test_received_mask_stays_intact_while_the_next_two_arrive(ring_pair) -> None:
    """A worker's step may still be copying its mask when the next step's arrives."""
    writer, reader = ring_pair
    receiver = GrammarReceiver(reader.read, max_rows=4, pin_memory=False)
    grammars = [filled([0, 1, 2], num_words=5, seed=s) for s in range(3)]
    received = []
    for grammar in grammars:
        send_sample(writer.write, Op.SAMPLE, grammar)
        received.append(receive_sample(reader, receiver)[1])
    for grammar, got in zip(grammars, received):
        assert np.array_equal(got.bitmask, grammar.bitmask) and got.rows == [0, 1, 2]


def test_a_mask_of_the_wrong_size_is_refused(ring_pair) -> None:
    writer, reader = ring_pair
    receiver = GrammarReceiver(reader.read, max_rows=4, pin_memory=False)
    writer.write(allocate_bitmask(3, 64).numpy().tobytes()[:-4])
    with pytest.raises(RuntimeError, match="does not have 3 rows"):
        receiver.receive([0, 1, 2])


def test_worker_runner_samples_under_the_received_mask(tiny_qwen3_dir: str, ring_pair) -> None:
    """The path of a worker's step: FORWARD decoded and launched, then the SAMPLE message and
    the mask rank 0 sent, under which the runner samples: each constrained row samples its
    only allowed token."""
    writer, reader = ring_pair
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4)
    try:
        runner = llm.engine.executor.runner
        receiver = GrammarReceiver(reader.read, max_rows=4, pin_memory=False)
        greedy = SamplingParams(temperature=0.0)
        prompts = {"a": [5, 17, 42], "b": [9, 8, 7, 6, 5], "c": [3, 1]}
        new = [NewRequestData(r, p, greedy) for r, p in prompts.items()]
        chunks = [
            ScheduledChunk(r, p, 0, [2 * i, 2 * i + 1], 0, True)
            for i, (r, p) in enumerate(prompts.items())
        ]
        allowed = {0: 7, 2: 300}  # rows a and c; b is unconstrained
        bitmask = torch.zeros(2, 16, dtype=torch.int32)
        for i, token_id in enumerate(allowed.values()):
            bitmask[i, token_id // 32] = 1 << (token_id % 32)
        grammar = GrammarOutput(list(allowed), bitmask.numpy())
        writer.write(encode(Op.FORWARD, SchedulerOutput(chunks, 0, new)))
        send_sample(writer.write, Op.SAMPLE, grammar)  # rank 0, once its mask is filled
        _, sched_out, _ = decode(reader.read())
        forward = runner.forward(sched_out)
        _, received = receive_sample(reader, receiver)
        out = runner.sample(forward, received).result()
        assert out.req_ids == ["a", "b", "c"]
        assert [out.sampled_token_ids[row] for row in allowed] == list(allowed.values())
    finally:
        llm.shutdown()
