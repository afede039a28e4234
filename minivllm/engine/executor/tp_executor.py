"""Tensor parallelism: rank 0 (this process) schedules; ranks 1..N-1 are worker processes.

Every step, rank 0 writes the SchedulerOutput (compactly encoded) into a shared-memory ring,
then every rank, rank 0 included, runs the same runner call on it: the same model shard
collectives, the same sampling on the same all-gathered logits. Rank 0's RunnerOutput is the
one the scheduler sees; the workers' identical ones are dropped.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
import weakref
from contextlib import contextmanager

import torch
import torch.distributed as dist

from minivllm.distributed.teardown import release_process_group
from minivllm.engine.executor.shm_ring import ShmRing
from minivllm.engine.executor.step_codec import Op, encode
from minivllm.engine.executor.tp_worker import WorkerSpec, init_rank
from minivllm.engine.executor.worker_group import WorkerGroup
from minivllm.engine.runner.step_handle import StepHandle
from minivllm.engine.setup import EngineSetup
from minivllm.engine.types import RunnerOutput, SchedulerOutput
from minivllm.models.model_config import ModelConfig

# Workers import torch and minivllm before they report "up"; a slow disk can take a while.
_STARTUP_TIMEOUT_S = 300.0
# A step that raised on rank 0 raises on every rank; the workers report it within this time.
_STEP_ERROR_WAIT_S = 5.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_shardable(model_config: ModelConfig, tp_size: int) -> None:
    """Raises ValueError, naming the numbers, for a model that tp_size ranks cannot split."""
    for what, n in (
        ("number of attention heads", model_config.num_attention_heads),
        ("intermediate_size", model_config.intermediate_size),
    ):
        if n % tp_size:
            raise ValueError(f"{what} ({n}) is not divisible by tensor_parallel_size ({tp_size})")
    kv = model_config.num_key_value_heads
    if kv % tp_size and tp_size % kv:
        raise ValueError(
            f"number of KV heads ({kv}) and tensor_parallel_size ({tp_size}) must divide one "
            "another (fewer KV heads than ranks are replicated)"
        )


def _abort_process_group() -> None:
    """Called from a watcher thread when a worker dies: a blocked NCCL collective on rank 0
    would wait for it until the timeout; aborting makes it fail now. (Gloo notices the
    closed connection by itself.)"""
    try:
        if dist.is_initialized() and dist.get_backend() == "nccl":
            dist.distributed_c10d._abort_process_group()
    except Exception:
        pass


@contextmanager
def _deferred_interrupt():
    """Holds back a Ctrl-C (SIGINT) until the block ends: once a step is broadcast, rank 0
    must run it to the end, or the workers would wait in a collective forever."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(signal.SIGINT, caught[0])
            elif previous != signal.SIG_IGN:  # an ignored Ctrl-C (engine-core process) stays so
                raise KeyboardInterrupt


def _shutdown(group: WorkerGroup, ring: ShmRing, state: dict) -> None:
    """Stops the workers and frees the ring and the process group; runs once (weakref
    finalizer: at LLM.shutdown(), garbage collection or interpreter exit)."""
    told = False
    if group.failure is None and state["in_sync"]:
        try:
            with _deferred_interrupt():
                ring.write(encode(Op.SHUTDOWN), check=group.check)
            told = True
        except Exception:
            pass  # a worker is gone: reaping below is all that is left
    group.stop(grace=10.0 if told else 0.0)
    ring.close()
    release_process_group()


class TPExecutor:
    """The Executor of tensor_parallel_size > 1 when this process starts the workers."""

    def __init__(self, setup: EngineSetup) -> None:
        world_size = setup.config.tensor_parallel_size
        check_shardable(setup.model_config, world_size)
        if setup.device.type == "cuda" and torch.cuda.device_count() < world_size:
            raise ValueError(
                f"tensor_parallel_size={world_size} but only {torch.cuda.device_count()} GPUs "
                "are visible"
            )
        if dist.is_initialized():
            raise RuntimeError(
                "a torch.distributed process group is already initialized in this process; "
                "shut the other tensor-parallel LLM down first"
            )
        init_method = f"tcp://127.0.0.1:{free_port()}"
        self._ring = ShmRing.create(num_readers=world_size - 1)
        ring = self._ring.handle
        specs = [WorkerSpec(setup, r, init_method, ring) for r in range(1, world_size)]
        self._state = {"in_sync": True}
        try:
            self._group = WorkerGroup(specs, on_failure=_abort_process_group)
        except BaseException:
            self._ring.close()
            raise
        self._finalizer = weakref.finalize(self, _shutdown, self._group, self._ring, self._state)
        try:
            # Start-up errors of a worker (imports, device, config) fail here at once.
            self._group.wait_for("up", _STARTUP_TIMEOUT_S)
            self.runner, self.num_blocks = init_rank(setup, 0, init_method, 0)
            self._group.wait_for("ready", _STARTUP_TIMEOUT_S)
        except BaseException as e:
            failure = self._group.failure
            self._finalizer()
            if failure is not None and not isinstance(e, KeyboardInterrupt):
                raise RuntimeError(failure) from e
            raise

    @property
    def workers(self) -> list:
        return self._group.procs

    def execute(self, sched_out: SchedulerOutput) -> RunnerOutput:
        return self._run(Op.EXECUTE, sched_out)

    def execute_async(self, sched_out: SchedulerOutput) -> StepHandle:
        return self._run(Op.EXECUTE_ASYNC, sched_out)

    def _run(self, op: Op, sched_out: SchedulerOutput):
        if not self._finalizer.alive:
            raise RuntimeError("the tensor-parallel engine has shut down; create a new LLM")
        # The step codec carries no bitmask: constrained requests are refused under TP.
        assert sched_out.structured_output is None
        self._group.check()
        with _deferred_interrupt():
            errors_before = self._group.num_step_errors()
            self._broadcast(op, sched_out)
            try:
                if op == Op.EXECUTE_ASYNC:
                    return self.runner.execute_async(sched_out)
                return self.runner.execute(sched_out)
            except Exception as e:
                self._raise_if_failed(e)
                if not self._group.wait_step_errors(errors_before + 1, _STEP_ERROR_WAIT_S):
                    # Only rank 0 failed: the workers wait in a collective that never comes.
                    self._state["in_sync"] = False
                    self._finalizer()
                    raise RuntimeError(
                        "a tensor-parallel step failed on rank 0 only; the engine has shut "
                        f"down, create a new LLM ({type(e).__name__}: {e})"
                    ) from e
                raise  # it failed on every rank: they are all ready for the next step

    def _broadcast(self, op: Op, sched_out: SchedulerOutput) -> None:
        try:
            self._ring.write(encode(op, sched_out), check=self._group.check)
        except BaseException:
            self._state["in_sync"] = False
            raise

    def _raise_if_failed(self, error: Exception) -> None:
        """A collective that fails because a worker died says so, naming the rank."""
        failure = self._group.failure
        if failure is None and any(proc.poll() is not None for proc in self._group.procs):
            # Gloo may see the closed socket before the watcher thread records the exit.
            deadline = time.monotonic() + 2.0
            while self._group.failure is None and time.monotonic() < deadline:
                time.sleep(0.01)
            failure = self._group.failure
        if failure is not None:
            raise RuntimeError(failure) from error

    def shutdown(self) -> None:
        self._finalizer()
