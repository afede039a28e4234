"""GlooBroadcast between three gloo ranks, rank 1 not a member: messages arrive whole and in
order (empty, one frame, several frames, a memoryview); keep-alives are skipped; a reader
whose writer stays silent fails after the group's timeout instead of waiting forever."""

from __future__ import annotations

import datetime
import os
import time

import torch.distributed as dist
import torch.multiprocessing as mp

from minivllm.distributed.gloo_broadcast import FRAME_BYTES, GlooBroadcast
from minivllm.engine.executor.tp_executor import free_port

MESSAGES = [b"", b"step", bytes(range(256)) * (3 * FRAME_BYTES // 256 + 7)]


def _rank(rank: int, port: int, result_dir: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=3,
        timeout=datetime.timedelta(seconds=30),
    )
    if rank != 1:
        channel = GlooBroadcast.create([0, 2], timeout_s=2.0)
        if rank == 0:
            channel.start_keep_alive(on_error=lambda e: None)
            for message in MESSAGES:
                channel.write(message)
                time.sleep(1.0)  # keep-alives go out meanwhile (every 0.5 s at a 2 s timeout)
            channel.write(memoryview(b"last"))
            channel.stop_keep_alive()
            time.sleep(4.0)  # silent past the reader's timeout
        else:
            got = [channel.read() for _ in range(len(MESSAGES) + 1)]
            assert got == [*MESSAGES, b"last"], [len(m) for m in got]
            start = time.monotonic()
            try:
                channel.read()
                outcome = "no timeout"
            except RuntimeError:
                outcome = f"timeout {time.monotonic() - start:.1f}"
            with open(os.path.join(result_dir, "reader"), "w") as f:
                f.write(outcome)
    dist.barrier()
    dist.destroy_process_group()


def test_messages_keep_alives_and_timeout(tmp_path) -> None:
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, str(tmp_path))) for r in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
    codes = [proc.exitcode for proc in procs]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    assert codes == [0, 0, 0]
    outcome = (tmp_path / "reader").read_text()
    assert outcome.startswith("timeout"), outcome
    assert 1.5 < float(outcome.split()[1]) < 4.0
