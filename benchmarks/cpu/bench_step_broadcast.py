"""Per-step cost of the tensor-parallel step broadcast (CPU only, no model): encode and ring
write on rank 0, read and decode on a worker process, for a decode batch. Prints one JSON line.

python -m benchmarks.cpu.bench_step_broadcast [--batch 256] [--steps 2000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import pickle
import time

from minivllm.engine.executor.shm_ring import ShmRing
from minivllm.engine.executor.step_codec import Op, decode, encode
from minivllm.engine.types import ScheduledChunk, SchedulerOutput


def decode_step(batch: int, step: int) -> SchedulerOutput:
    """A decode step of `batch` requests at ~500 tokens, one new block every 16 steps."""
    chunks = [
        ScheduledChunk(str(r), [1000 + r], 500 + step, [r] * ((step + r) % 16 == 0), 32, True)
        for r in range(batch)
    ]
    return SchedulerOutput(chunks, batch)


def _reader(handle, steps: int, queue) -> None:
    ring = ShmRing.attach(handle, 0)
    seconds = 0.0
    for _ in range(steps):
        data = ring.read()
        start = time.perf_counter()
        decode(data)
        seconds += time.perf_counter() - start
    ring.close()
    queue.put(seconds / steps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    steps = [decode_step(args.batch, i) for i in range(args.steps)]
    ring = ShmRing.create(num_readers=1)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_reader, args=(ring.handle, args.steps, queue))
    proc.start()
    encode_s = write_s = 0.0
    for sched_out in steps:
        t0 = time.perf_counter()
        data = encode(Op.FORWARD, sched_out)
        t1 = time.perf_counter()
        ring.write(data)
        write_s += time.perf_counter() - t1
        encode_s += t1 - t0
        time.sleep(0.0002)  # a step's worth of other work, so the reader keeps up
    decode_s = queue.get()
    proc.join()
    ring.close()
    start = time.perf_counter()
    for sched_out in steps[:200]:
        pickle.loads(pickle.dumps(sched_out, protocol=5))
    dataclass_pickle_s = (time.perf_counter() - start) / 200
    result = {
        "bench": "step_broadcast",
        "batch": args.batch,
        "bytes": len(data),
        "dataclass_pickle_bytes": len(pickle.dumps(steps[-1], protocol=5)),
        "encode_us": round(1e6 * encode_s / args.steps, 1),
        "write_us": round(1e6 * write_s / args.steps, 1),
        "decode_us": round(1e6 * decode_s, 1),
        "dataclass_pickle_round_trip_us": round(1e6 * dataclass_pickle_s, 1),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
