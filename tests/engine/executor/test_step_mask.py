"""A constrained step's mask under TP, without processes: the step carries its rows, the mask
rank 0 fills goes through the ring as the next message and comes out equal on a worker, an
unconstrained step sends nothing more, a failed fill fails the worker's fill too, a received
mask stays intact while the next ones arrive, and a worker's runner samples under it."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.engine.executor.shm_ring import ShmRing
from minivllm.engine.executor.step_codec import Op, decode, encode
from minivllm.engine.executor.step_mask import MaskReceiver, SentMask
from minivllm.engine.types import NewRequestData, ScheduledChunk, SchedulerOutput
from minivllm.structured_output.bitmask import allocate_bitmask


class FilledMask:
    """A StepMask standing in for the scheduler's: fill() returns a fixed mask (random
    words, unless given)."""

    def __init__(
        self, rows: list[int], num_words: int, seed: int, bitmask: torch.Tensor | None = None
    ) -> None:
        self.rows = rows
        generator = torch.Generator().manual_seed(seed)
        shape = (len(rows), num_words)
        self.bitmask = bitmask
        if bitmask is None:
            self.bitmask = torch.randint(
                -(2**31), 2**31 - 1, shape, dtype=torch.int32, generator=generator
            )
        self.num_fills = 0

    def fill(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.num_fills += 1
        return self.bitmask, torch.tensor(self.rows, dtype=torch.int64)


class FailingMask:
    rows = [0]

    def fill(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise ValueError("the matcher failed")


@pytest.fixture
def ring_pair():
    # Small slots: a mask spans several of them (a step with new requests, several more).
    writer = ShmRing.create(num_readers=1, num_slots=8, slot_bytes=256)
    reader = ShmRing.attach(writer.handle, 0)
    yield writer, reader
    reader.close()
    writer.close()


def step(mask=None) -> SchedulerOutput:
    chunks = [ScheduledChunk(str(i), [7 + i], 3, [], 1, True) for i in range(4)]
    return SchedulerOutput(chunks, 4, structured_output=mask)


def test_constrained_step_then_its_mask_arrive_equal(ring_pair) -> None:
    writer, reader = ring_pair
    receiver = MaskReceiver(reader.read, max_rows=4, pin_memory=False)
    mask = FilledMask([1, 3], num_words=40, seed=0)  # 320 bytes: two slots
    sent = SentMask(mask, writer.write)
    writer.write(encode(Op.EXECUTE_ASYNC, step(mask)))
    op, received = decode(reader.read(), receiver.expect)
    assert op == Op.EXECUTE_ASYNC and received.structured_output.rows == [1, 3]
    head_bitmask, head_rows = sent.fill()  # rank 0's runner, after launching its forward
    assert torch.equal(head_bitmask, mask.bitmask) and mask.num_fills == 1
    bitmask, rows = received.structured_output.fill()  # a worker's runner
    assert torch.equal(bitmask, mask.bitmask)
    assert rows.dtype == torch.int64 and rows.tolist() == [1, 3]


def test_unconstrained_step_sends_no_mask(ring_pair) -> None:
    writer, reader = ring_pair
    receiver = MaskReceiver(reader.read, max_rows=4, pin_memory=False)
    writer.write(encode(Op.EXECUTE, step()))
    writer.write(encode(Op.SHUTDOWN))
    op, received = decode(reader.read(), receiver.expect)
    assert op == Op.EXECUTE and received.structured_output is None
    assert decode(reader.read(), receiver.expect) == (Op.SHUTDOWN, None)


def test_constrained_step_without_a_receiver_is_an_error() -> None:
    data = encode(Op.EXECUTE, step(FilledMask([0], num_words=2, seed=0)))
    with pytest.raises(ValueError, match="expect_mask"):
        decode(data)


def test_failed_fill_on_rank0_fails_the_workers_fill(ring_pair) -> None:
    writer, reader = ring_pair
    receiver = MaskReceiver(reader.read, max_rows=4, pin_memory=False)
    with pytest.raises(ValueError, match="matcher failed"):
        SentMask(FailingMask(), writer.write).fill()
    with pytest.raises(RuntimeError, match="rank 0 could not fill"):
        receiver.expect([0]).fill()
    # The next mask comes through as usual.
    mask = FilledMask([2], num_words=3, seed=1)
    SentMask(mask, writer.write).fill()
    assert torch.equal(receiver.expect([2]).fill()[0], mask.bitmask)


def test_received_mask_stays_intact_while_the_next_two_arrive(ring_pair) -> None:
    """A worker's step may still be copying its mask when the next step's arrives."""
    writer, reader = ring_pair
    receiver = MaskReceiver(reader.read, max_rows=4, pin_memory=False)
    masks = [FilledMask([0, 1, 2], num_words=5, seed=s) for s in range(3)]
    received = []
    for mask in masks:
        SentMask(mask, writer.write).fill()
        received.append(receiver.expect(mask.rows).fill())
    for mask, (bitmask, rows) in zip(masks, received):
        assert torch.equal(bitmask, mask.bitmask) and rows.tolist() == [0, 1, 2]


def test_a_mask_of_the_wrong_size_is_refused(ring_pair) -> None:
    writer, reader = ring_pair
    receiver = MaskReceiver(reader.read, max_rows=4, pin_memory=False)
    writer.write(allocate_bitmask(3, 64).numpy().tobytes()[:-4])
    with pytest.raises(RuntimeError, match="does not have 3 rows"):
        receiver.expect([0, 1, 2]).fill()


def test_worker_runner_samples_under_the_received_mask(tiny_qwen3_dir: str, ring_pair) -> None:
    """The path of a worker's step: decoded with the receiver, run by a runner, whose fill()
    reads the mask rank 0 sent: each constrained row samples its only allowed token."""
    writer, reader = ring_pair
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4)
    try:
        runner = llm.engine.executor.runner
        receiver = MaskReceiver(reader.read, max_rows=4, pin_memory=False)
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
        mask = FilledMask(list(allowed), num_words=16, seed=0, bitmask=bitmask)
        writer.write(encode(Op.EXECUTE, SchedulerOutput(chunks, 0, new, structured_output=mask)))
        SentMask(mask, writer.write).fill()  # rank 0, once its forward is launched
        _, sched_out = decode(reader.read(), receiver.expect)
        out = runner.execute(sched_out)
        assert out.req_ids == ["a", "b", "c"]
        assert [out.sampled_token_ids[row] for row in allowed] == list(allowed.values())
    finally:
        llm.shutdown()
