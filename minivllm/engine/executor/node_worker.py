"""The tensor-parallel ranks of a node other than node 0: `run_headless` (what `minivllm serve
MODEL --headless --node-rank R ...` runs) starts one process per rank of this node and waits;
each (`python -m minivllm.engine.executor.node_worker`) joins the process group at
master_addr:master_port, takes node 0's EngineSetup and then every step from the gloo broadcast
(distributed/gloo_broadcast.py), and runs it as node 0's ranks do.

Every rank beats a heartbeat into the rendezvous store; when a rank of this node dies, the
launcher posts which one into the store (node 0 fails at once, naming it), stops the rest and
exits 1. The ranks exit when node 0 sends SHUTDOWN (the launcher then exits 0), when node 0
is gone (its connection closes, or no message comes for distributed_timeout_seconds), or
when the launcher is gone (their stdin closes). The launcher also stops them when node 0
posts a failure or its store goes away.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass

from minivllm.config import EngineConfig
from minivllm.distributed.gloo_broadcast import GlooBroadcast
from minivllm.distributed.liveness import (
    BEAT_INTERVAL_S,
    FAILURE_KEY,
    connect_store,
    start_heartbeat,
    step_errors_key,
)
from minivllm.engine.executor.remote_ranks import ranks_of_node, remote_ranks, rendezvous_address
from minivllm.engine.executor.tp_worker import (
    _LENGTH,
    JOIN_TIMEOUT_S,
    _read_exact,
    _send,
    _watch_parent,
    build_runner,
    join_process_group,
    serve_steps,
)
from minivllm.engine.executor.worker_group import WorkerGroup
from minivllm.engine.setup import EngineSetup

_MODULE = "minivllm.engine.executor.node_worker"


@dataclass(frozen=True)
class NodeWorkerSpec:
    """What a rank of this node needs before node 0 sends it the rest (sent on its stdin)."""

    config: EngineConfig  # this node's, from its command line
    rank: int
    local_rank: int  # its GPU on this node


def run_headless(config: EngineConfig) -> int:
    """Runs this node's ranks until node 0 shuts them down (0) or one of them fails (1)."""
    if config.nnodes < 2 or config.node_rank < 1:
        raise ValueError(
            "--headless runs the tensor-parallel ranks of a node other than node 0: give "
            f"--nnodes >= 2 and --node-rank >= 1 (got nnodes={config.nnodes}, "
            f"node_rank={config.node_rank})"
        )
    ranks = ranks_of_node(config, config.node_rank)
    specs = [NodeWorkerSpec(config, rank, i) for i, rank in enumerate(ranks)]
    print(
        f"[minivllm] node {config.node_rank}/{config.nnodes}: ranks {ranks.start}..{ranks.stop - 1}"
        f" joining {rendezvous_address(config)}",
        file=sys.stderr,
    )
    # Node 0 first: its rank 0 hosts the store (this waits for it to come up).
    store = connect_store(config.master_addr, config.master_port, JOIN_TIMEOUT_S)
    group = WorkerGroup(specs, on_failure=lambda: None, module=_MODULE)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        failure, ours = _wait(group, config, store)
    except (KeyboardInterrupt, SystemExit):
        failure, ours = f"node {config.node_rank} was stopped (a signal to its launcher)", True
    if failure is None:
        group.stop(grace=10.0)
        return 0
    print(f"[minivllm] {failure}", file=sys.stderr)
    if ours:
        try:  # node 0 may be gone itself: then there is no one to tell
            store.set(FAILURE_KEY, failure)
        except Exception:
            pass
    group.stop(grace=0.0)
    return 1


def _wait(group: WorkerGroup, config: EngineConfig, store) -> tuple[str | None, bool]:
    """(None, _) once every rank exited 0 (node 0 shut them down); else (the first failure,
    whether it is this node's)."""
    ranks = ranks_of_node(config, config.node_rank)
    next_poll = 0.0
    while True:
        codes = [proc.poll() for proc in group.procs]
        for rank, proc, code in zip(ranks, group.procs, codes):
            if code not in (None, 0):
                reason = group.error_of(rank) or f"exit code {code}"
                return (
                    f"tensor-parallel rank {rank} on node {config.node_rank} (pid {proc.pid}) "
                    f"failed: {reason}"
                ), True
        if all(code == 0 for code in codes):
            return None, False
        if time.monotonic() >= next_poll:
            next_poll = time.monotonic() + BEAT_INTERVAL_S
            elsewhere = _failure_elsewhere(store)
            if elsewhere is not None and not _exit_cleanly(group):
                return elsewhere, False
        time.sleep(0.05)


def _failure_elsewhere(store) -> str | None:
    """What node 0's store says failed, or that the store (node 0's rank 0) is gone."""
    try:
        if store.check([FAILURE_KEY]):
            return f"stopping: {store.get(FAILURE_KEY).decode()}"
    except Exception as e:
        return f"lost node 0 (its rendezvous store: {type(e).__name__})"
    return None


def _exit_cleanly(group: WorkerGroup) -> bool:
    """Whether the ranks exit 0 within a moment (node 0 shut them down, then went away)."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        codes = [proc.poll() for proc in group.procs]
        if all(code is not None for code in codes):
            return all(code == 0 for code in codes)
        time.sleep(0.05)
    return False


def head_setup(data: bytes, config: EngineConfig) -> EngineSetup:
    """Node 0's EngineSetup (every rank must run what node 0 resolved), with this node's
    model path, after checking that both command lines describe the same world."""
    setup: EngineSetup = pickle.loads(data)
    head = setup.config
    for name in ("tensor_parallel_size", "nnodes"):
        if getattr(head, name) != getattr(config, name):
            raise ValueError(
                f"node 0 runs {name}={getattr(head, name)} but node {config.node_rank} was "
                f"given {getattr(config, name)}; give every node the same value"
            )
    if setup.device.type != config.resolved_device().type:
        raise ValueError(
            f"node 0 runs on {setup.device.type} but node {config.node_rank} has "
            f"{config.resolved_device().type}"
        )
    return dataclasses.replace(setup, config=dataclasses.replace(head, model=config.model))


def _start_rank(spec: NodeWorkerSpec, status_fd: int):
    """Joins the world and builds this rank; returns (runner, num_blocks, channel, store)."""
    config = spec.config
    timeout_s = config.distributed_timeout_seconds
    store = connect_store(config.master_addr, config.master_port, JOIN_TIMEOUT_S)
    start_heartbeat(store, spec.rank, on_lost=_exit_lost)
    device = join_process_group(
        config, config.resolved_device(), spec.rank, rendezvous_address(config), spec.local_rank
    )
    channel = GlooBroadcast.create([0, *remote_ranks(config)], timeout_s)
    setup = head_setup(channel.read(), config)
    runner, num_blocks = build_runner(setup, device)
    return runner, num_blocks, channel, store


def _exit_lost(message: str) -> None:
    print(f"[minivllm] {message}: exiting", file=sys.stderr, flush=True)
    os._exit(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="minivllm tensor-parallel rank (internal)")
    parser.add_argument("--status-fd", type=int, required=True)
    args = parser.parse_args(argv)
    stdin, status_fd = sys.stdin.fileno(), args.status_fd
    try:
        (length,) = _LENGTH.unpack(_read_exact(stdin, _LENGTH.size))
        spec: NodeWorkerSpec = pickle.loads(_read_exact(stdin, length))
        threading.Thread(target=_watch_parent, args=(stdin,), daemon=True).start()
        _send(status_fd, ("up",))
        runner, num_blocks, channel, store = _start_rank(spec, status_fd)
        gc.collect()
        gc.freeze()  # as EngineCore does: full collections then skip torch and the model
        _send(status_fd, ("ready", num_blocks))
    except BaseException as e:
        _send(status_fd, ("error", f"{type(e).__name__}: {e}", traceback.format_exc()))
        traceback.print_exc()
        raise SystemExit(1) from None
    code = 1
    try:
        # A failed step is counted in the store, where node 0 checks that every rank failed.
        serve_steps(runner, channel, lambda message: store.add(step_errors_key(spec.rank), 1))
        code = 0
    except BaseException as e:
        message = f"[minivllm] rank {spec.rank}: lost node 0 ({type(e).__name__}: {e})"
        print(message, file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # skip the interpreter's slow teardown of torch: nothing is left


if __name__ == "__main__":
    main()
