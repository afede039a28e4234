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
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from minivllm.config import EngineConfig
from minivllm.engine.executor.shm_ring import RingHandle, ShmRing
from minivllm.engine.executor.step_codec import Op, decode
from minivllm.engine.executor.step_mask import GrammarReceiver
from minivllm.engine.runner.model_runner import ModelRunner
from minivllm.engine.setup import EngineSetup

_LENGTH = struct.Struct("<Q")
# How long the ranks wait for one another to join: other nodes are started by hand, and every
# rank imports torch first. Once joined, a collective waits distributed_timeout_seconds.
JOIN_TIMEOUT_S = 300.0


class StepSource(Protocol):
    def read(self) -> bytes: ...


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
    device = join_process_group(setup.config, setup.device, rank, init_method, local_rank)
    return build_runner(setup, device)


def join_process_group(
    config: EngineConfig, device: torch.device, rank: int, init_method: str, local_rank: int
) -> torch.device:
    """Joins the default process group as `rank` (on CUDA: GPU `local_rank` of this node, and
    NCCL); returns this rank's device. init_method: tcp://host:port (rank 0 hosts the store
    there; the others wait up to JOIN_TIMEOUT_S for it) or env:// (torchrun's). A collective
    that waits longer than config.distributed_timeout_seconds fails (dead workers are usually
    noticed much sooner: engine/executor/worker_group.py, distributed/liveness.py)."""
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"tensor-parallel rank {rank} needs GPU {local_rank} of its node but "
                f"{torch.cuda.device_count()} are visible"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    store = None
    if init_method.startswith("tcp://"):
        url = urllib.parse.urlsplit(init_method)
        store = dist.TCPStore(
            url.hostname,
            url.port,
            config.tensor_parallel_size,
            is_master=rank == 0,
            timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S),
        )
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=None if store is not None else init_method,
        store=store,
        world_size=config.tensor_parallel_size,
        rank=rank,
        timeout=datetime.timedelta(seconds=config.distributed_timeout_seconds),
        device_id=device if device.type == "cuda" else None,
    )
    return device


def build_runner(setup: EngineSetup, device: torch.device) -> tuple[ModelRunner, int]:
    """This rank's runner and KV cache, once it has joined the process group (collective)."""
    torch.manual_seed(setup.config.seed)
    runner = ModelRunner(setup, device)  # chooses the TP all-reduce (collective)
    num_blocks = torch.tensor([runner.determine_num_blocks()], device=device)
    dist.all_reduce(num_blocks, op=dist.ReduceOp.MIN)
    if num_blocks.item() >= 1:
        runner.initialize_kv_cache(int(num_blocks.item()))
    return runner, int(num_blocks.item())


def serve_steps(runner: ModelRunner, ring: StepSource, report: Callable[[tuple], None]) -> None:
    """Runs every step rank 0 broadcasts (read from the shared-memory ring on rank 0's node, from
    distributed/gloo_broadcast.py on the others), through the same runner calls as rank 0 (so
    every rank samples the same tokens and keeps the same state), until SHUTDOWN. A call that
    raises is reported (rank 0 checks that it failed on every rank) and skipped."""
    forward = None  # the step whose forward is launched, sampled at the next SAMPLE
    pending = None  # the handle of a sampled async step, collected at the next sample
    grammars = grammar_receiver(runner, ring)
    while True:
        op, sched_out, grammar_rows = decode(ring.read())
        try:
            if op in (Op.FORWARD, Op.FORWARD_AFTER_READ):
                if op == Op.FORWARD_AFTER_READ and pending is not None:
                    pending, previous = None, pending  # as rank 0 read it, before its forward
                    previous.result()
                forward = runner.forward(sched_out)
                continue
            if op in (Op.SAMPLE, Op.SAMPLE_ASYNC):
                grammar = None if grammar_rows is None else grammars.receive(grammar_rows)
                step, forward = forward, None
                if step is None:
                    raise RuntimeError("a sample message without a launched forward")
                handle = runner.sample(step, grammar)
                if pending is not None:
                    pending, previous = None, pending
                    previous.result()
                if op == Op.SAMPLE_ASYNC:
                    pending = handle
                else:
                    handle.result()
                continue
            if pending is not None:
                pending, previous = None, pending
                previous.result()
            if op == Op.SHUTDOWN:
                return
        except Exception as e:
            # Every rank runs the same code on the same data, so rank 0 failed the same way
            # and raises it to the user; this rank stays ready for the next step.
            report(("step_error", f"{type(e).__name__}: {e}"))


def grammar_receiver(runner: ModelRunner, ring: StepSource) -> GrammarReceiver:
    """Where this worker's constrained steps read the bitmask rank 0 filled: the next message
    from rank 0 after the step's SAMPLE."""
    pin_memory = runner.device.type == "cuda"
    return GrammarReceiver(ring.read, runner.limits.max_num_seqs, pin_memory)


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
