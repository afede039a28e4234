"""The shared-memory ring: every reader gets every message in order (wraparound, several
readers in other processes, messages larger than a slot), a full ring waits for the slowest
reader, and a waiting side's liveness check can end the wait. Also the step codec."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import time

import pytest

from minivllm.engine.executor.shm_ring import ShmRing
from minivllm.engine.executor.step_codec import Op, decode, encode
from minivllm.engine.types import NewRequestData, ScheduledChunk, SchedulerOutput
from minivllm.sampling_params import SamplingParams


def messages(n: int) -> list[bytes]:
    # Sizes around the slot size (64 bytes of room minus a 5-byte header) and far past it.
    sizes = [0, 1, 58, 59, 60, 118, 119, 1000, 5000]
    return [bytes((i + j) % 251 for j in range(sizes[i % len(sizes)])) for i in range(n)]


def _reader(handle, reader: int, n: int, queue) -> None:
    ring = ShmRing.attach(handle, reader)
    got = [ring.read() for _ in range(n)]
    ring.close()
    queue.put((reader, got))


def test_in_process_wraparound_and_large_messages() -> None:
    ring = ShmRing.create(num_readers=1, num_slots=3, slot_bytes=64)
    reader = ShmRing.attach(ring.handle, 0)
    try:
        # Many times around a 3-slot ring; a message may fill all three slots (3 x 59 bytes).
        for message in [m[:177] for m in messages(40)]:
            ring.write(message)
            assert reader.read() == message
    finally:
        reader.close()
        ring.close()


@pytest.mark.parametrize("num_readers", [1, 3])
def test_readers_in_other_processes_get_every_message(num_readers: int) -> None:
    sent = messages(60)
    ring = ShmRing.create(num_readers=num_readers, num_slots=4, slot_bytes=64)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_reader, args=(ring.handle, r, len(sent), queue))
        for r in range(num_readers)
    ]
    for p in procs:
        p.start()
    try:
        for message in sent:
            ring.write(message)
        results = dict(queue.get(timeout=30) for _ in procs)
        assert sorted(results) == list(range(num_readers))
        assert all(got == sent for got in results.values())
    finally:
        for p in procs:
            p.join(timeout=10)
        ring.close()


def test_full_ring_waits_and_check_ends_the_wait() -> None:
    ring = ShmRing.create(num_readers=2, num_slots=2, slot_bytes=64)
    reader = ShmRing.attach(ring.handle, 0)  # reader 1 never reads
    try:
        ring.write(b"a")
        ring.write(b"b")
        assert reader.read() == b"a"

        def gone():
            raise RuntimeError("reader 1 is gone")

        start = time.monotonic()
        with pytest.raises(RuntimeError, match="gone"):
            ring.write(b"c", check=gone)  # slot 0 is still unread by reader 1
        assert time.monotonic() - start < 2
    finally:
        reader.close()
        ring.close()


def test_step_codec_round_trip_and_is_compact() -> None:
    chunks = [
        ScheduledChunk(str(i), [1000 + i], 500 + i, [i] if i % 16 == 0 else [], 32, True)
        for i in range(256)
    ]
    new = [NewRequestData("x", [1, 2, 3], SamplingParams(temperature=0.5, seed=3))]
    sched_out = SchedulerOutput(chunks, 256, new, ["gone"], ["preempted"])
    op, back, rows = decode(encode(Op.FORWARD, sched_out))
    assert op == Op.FORWARD and back == sched_out and rows is None
    assert len(encode(Op.FORWARD, sched_out)) < len(pickle.dumps(sched_out, protocol=5)) * 0.7
    assert decode(encode(Op.SHUTDOWN)) == (Op.SHUTDOWN, None, None)
