"""TorchrunExecutor: torchrun started every rank, and each runs the whole engine in lockstep."""

from __future__ import annotations

import os

import torch.distributed as dist

from minivllm.distributed.liveness import (
    NodeMonitor,
    StoreThread,
    connect_store,
    start_heartbeat,
)
from minivllm.distributed.teardown import release_process_group
from minivllm.engine.executor.local import LocalExecutor
from minivllm.engine.executor.tp_executor import _abort_process_group, check_shardable
from minivllm.engine.executor.tp_worker import init_rank
from minivllm.engine.runner.drafts.proposers import build_proposer
from minivllm.engine.runner.step_handle import ForwardStep, StepHandle
from minivllm.engine.setup import EngineSetup
from minivllm.engine.types import GrammarOutput, SchedulerOutput


def torchrun_rank() -> tuple[int, int, int] | None:
    """(rank, local_rank, world_size) when this process was started by torchrun, else None.
    local_rank is the index on this node (torchrun's LOCAL_RANK): the GPU this rank runs on."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" not in env or "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    if "LOCAL_RANK" not in env:
        raise ValueError("torchrun set RANK and WORLD_SIZE but not LOCAL_RANK (this rank's GPU)")
    return int(env["RANK"]), int(env["LOCAL_RANK"]), int(env["WORLD_SIZE"])


class TorchrunExecutor(LocalExecutor):
    """Under torchrun every rank runs the user's script, so every rank builds the same LLM,
    gets the same requests and runs the whole engine: the schedulers agree step by step
    (same inputs, same all-gathered logits, same keyed sampling), and nothing is broadcast.
    Every rank returns the outputs; print them on rank 0 only. Across nodes (torchrun
    --nnodes) only the launch differs: each rank takes its GPU from LOCAL_RANK, and nothing
    is shared but the process group."""

    def __init__(self, setup: EngineSetup, rank: int, local_rank: int, world_size: int) -> None:
        tp_size = setup.config.tensor_parallel_size
        if world_size != tp_size:
            raise ValueError(
                f"torchrun started {world_size} processes but tensor_parallel_size is "
                f"{tp_size}; they must be equal"
            )
        if setup.config.nnodes != 1:
            raise ValueError(
                "under torchrun, torchrun places the ranks on the nodes (its --nnodes, "
                f"--node-rank); leave nnodes at 1 (got nnodes={setup.config.nnodes})"
            )
        check_shardable(setup.model_config, world_size)
        self.runner, self.num_blocks = init_rank(setup, rank, "env://", local_rank)
        proposer = build_proposer(setup)  # every rank schedules, so every rank drafts
        if proposer is not None:
            self.runner.attach_proposer(proposer)
        self._heartbeat, self._monitor = _watch_peers(
            setup.config.distributed_timeout_seconds, rank, world_size
        )
        self._closed = False

    def forward(self, sched_out: SchedulerOutput) -> ForwardStep:
        try:
            return self.runner.forward(sched_out)
        except RuntimeError as e:
            self._raise_if_peer_lost(e)
            raise

    def sample(self, step: ForwardStep, grammar: GrammarOutput | None) -> StepHandle:
        try:
            return self.runner.sample(step, grammar)
        except RuntimeError as e:
            self._raise_if_peer_lost(e)
            raise

    def _raise_if_peer_lost(self, error: RuntimeError) -> None:
        """A collective that failed because a peer went away says which one."""
        failure = self._monitor.explain()
        if failure is not None:
            raise RuntimeError(failure) from error

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self._monitor.stop()
            self._heartbeat.stop()
            release_process_group()
            super().shutdown()  # lets go of this rank's runner


def _watch_peers(timeout_s: float, rank: int, world_size: int) -> tuple[StoreThread, NodeMonitor]:
    """This rank's heartbeat and its watch over the others, in the store of torchrun's agent
    on the first node (MASTER_ADDR:MASTER_PORT; it outlives the ranks). The nodes of the
    ranks come from LOCAL_WORLD_SIZE (torchrun gives every node as many)."""
    env = os.environ
    store = connect_store(env["MASTER_ADDR"], int(env["MASTER_PORT"]), timeout_s)
    # Keys of this attempt only: after a restart (torchrun --max-restarts) the store still
    # holds the last attempt's beats and failure.
    store = dist.PrefixStore(f"attempt{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/", store)
    heartbeat = start_heartbeat(store, rank, on_lost=lambda message: None)  # collectives fail
    per_node = int(env.get("LOCAL_WORLD_SIZE", world_size))
    peers = {r: r // per_node for r in range(world_size) if r != rank}
    return heartbeat, NodeMonitor(store, peers, timeout_s, on_failure=_abort_process_group)
