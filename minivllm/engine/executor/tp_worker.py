"""A tensor-parallel rank: joining the process group, and the worker process's entry point.

`python -m minivllm.engine.executor.tp_worker --status-fd N` reads its WorkerSpec from
stdin, reports READY (or its error) on the status pipe, then runs every step rank 0
broadcasts through the shared-memory ring. It never imports the user's script, and it exits
when stdin closes (the parent is gone) or on SHUTDOWN.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import pickle
import struct
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from minivllm.engine.executor.shm_ring import RingHandle, ShmRing
from minivllm.engine.executor.step_codec import Op, decode
from minivllm.engine.runner.model_runner import ModelRunner
from minivllm.engine.setup import EngineSetup

# A collective that waits longer than this means a rank is gone (dead workers are usually
# noticed much sooner: see engine/executor/worker_group.py).
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)
_LENGTH = struct.Struct("<Q")


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs, as plain data (sent pickled on its stdin)."""

    setup: EngineSetup  # rank 0's, as EngineCore resolved it
    rank: int
    init_method: str  # tcp://host:port of rank 0's rendezvous
    ring: RingHandle


def init_rank(
    setup: EngineSetup, rank: int, init_method: str, local_rank: int
) -> tuple[ModelRunner, int]:
    """Joins the default process group (of setup's tensor_parallel_size ranks), builds this
    rank's runner and its KV cache (the smallest number of blocks that fits on every rank);
    returns (runner, num_blocks)."""
    config = setup.config
    world_size = config.tensor_parallel_size
    device = setup.device
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        init_method=init_method,
        world_size=world_size,
        rank=rank,
        timeout=COLLECTIVE_TIMEOUT,
        device_id=device if device.type == "cuda" else None,
    )
    torch.manual_seed(config.seed)
    runner = ModelRunner(setup, device)  # chooses the TP all-reduce (collective)
    num_blocks = torch.tensor([runner.determine_num_blocks()], device=device)
    dist.all_reduce(num_blocks, op=dist.ReduceOp.MIN)
    if num_blocks.item() >= 1:
        runner.initialize_kv_cache(int(num_blocks.item()))
    return runner, int(num_blocks.item())


def serve_steps(runner: ModelRunner, ring: ShmRing, report: Callable[[tuple], None]) -> None:
    """Runs every step rank 0 broadcasts, through the same runner calls as rank 0 (so every
    rank samples the same tokens and keeps the same state), until SHUTDOWN. A step that
    raises is reported (rank 0 checks that it failed on every rank) and skipped."""
    pending = None  # the handle of a launched async step, collected at the next message
    while True:
        op, sched_out = decode(ring.read())
        try:
            if op == Op.EXECUTE_ASYNC:
                handle = runner.execute_async(sched_out)
                if pending is not None:
                    pending.result()
                pending = handle
                continue
            if pending is not None:
                pending, previous = None, pending
                previous.result()
            if op == Op.SHUTDOWN:
                return
            runner.execute(sched_out)
        except Exception as e:
            # Every rank runs the same code on the same data, so rank 0 failed the same way
            # and raises it to the user; this rank stays ready for the next step.
            report(("step_error", f"{type(e).__name__}: {e}"))


def _send(fd: int, message: tuple) -> None:
    data = pickle.dumps(message)
    os.write(fd, _LENGTH.pack(len(data)) + data)


def _read_exact(fd: int, n: int) -> bytes:
    parts = []
    while n:
        part = os.read(fd, n)
        if not part:
            raise EOFError("the parent closed this worker's stdin")
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


def _watch_parent(fd: int) -> None:
    """Exits this process as soon as the parent's end of stdin closes (the parent died).
    Raw reads of fd 0: a buffered stdin would hold its lock at interpreter exit."""
    while os.read(fd, 1 << 16):
        pass
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="minivllm tensor-parallel worker (internal)")
    parser.add_argument("--status-fd", type=int, required=True)
    args = parser.parse_args(argv)
    stdin = sys.stdin.fileno()
    status_fd = args.status_fd
    try:
        (length,) = _LENGTH.unpack(_read_exact(stdin, _LENGTH.size))
        spec: WorkerSpec = pickle.loads(_read_exact(stdin, length))
        threading.Thread(target=_watch_parent, args=(stdin,), daemon=True).start()
        _send(status_fd, ("up",))
        ring = ShmRing.attach(spec.ring, spec.rank - 1)
        runner, num_blocks = init_rank(spec.setup, spec.rank, spec.init_method, spec.rank)
        gc.collect()
        gc.freeze()  # as EngineCore does: full collections then skip torch and the model
        _send(status_fd, ("ready", num_blocks))
    except BaseException as e:
        _send(status_fd, ("error", f"{type(e).__name__}: {e}", traceback.format_exc()))
        raise SystemExit(1) from None
    code = 1
    try:
        serve_steps(runner, ring, lambda message: _send(status_fd, message))
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        # The process group is left as it is: this process ends here (the driver frees what
        # NCCL held), and aborting it first waited ~10 s on rank 0 at every shutdown.
        ring.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # skip the interpreter's slow teardown of torch: nothing is left


if __name__ == "__main__":
    main()
