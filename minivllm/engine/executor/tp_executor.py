"""Tensor parallelism: rank 0 (this process) schedules; ranks 1..N-1 are worker processes.

Every step, rank 0 writes the SchedulerOutput (compactly encoded) into a shared-memory ring and
every rank, rank 0 included, launches the same forward on it; then rank 0 writes the step's
grammar output (if any) and every rank samples: the same model shard collectives, the same
sampling on the same all-gathered logits under the same masks. Rank 0's RunnerOutput is the
one the scheduler sees; the workers' identical ones are dropped.

Across nodes (nnodes > 1) this process starts only its own node's workers; the ranks of the
other nodes are started there (`minivllm serve --headless`) and get each step over gloo
(engine/executor/remote_ranks.py).
"""

from __future__ import annotations

import signal
import socket
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial
from typing import TypeVar

import torch
import torch.distributed as dist

from minivllm.distributed.teardown import release_process_group
from minivllm.engine.executor.remote_ranks import RemoteRanks, rendezvous_address
from minivllm.engine.executor.shm_ring import ShmRing
from minivllm.engine.executor.step_codec import Op, encode
from minivllm.engine.executor.step_mask import send_sample
from minivllm.engine.executor.tp_worker import (
    WorkerSpec,
    build_runner,
    join_process_group,
)
from minivllm.engine.executor.worker_group import WorkerGroup
from minivllm.engine.runner.drafts.draft_slots import grammar_for_step
from minivllm.engine.runner.drafts.proposers import build_proposer
from minivllm.engine.runner.step_handle import ForwardStep, StepHandle
from minivllm.engine.setup import EngineSetup
from minivllm.engine.types import GrammarOutput, SchedulerOutput
from minivllm.models.model_config import ModelConfig

# Workers import torch and minivllm before they report "up"; a slow disk can take a while.
_STARTUP_TIMEOUT_S = 300.0
# A step that raised on rank 0 raises on every rank; the workers report it within this time.
_STEP_ERROR_WAIT_S = 5.0

T = TypeVar("T")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_shardable(model_config: ModelConfig, tp_size: int) -> None:
    """Raises ValueError, naming the numbers, for a model that tp_size ranks cannot split."""
    sizes = [
        ("number of attention heads", model_config.num_attention_heads),
        ("intermediate_size", model_config.intermediate_size),
    ]
    if model_config.moe is not None:  # each rank holds a slice of every expert
        sizes.append(("moe_intermediate_size", model_config.moe.moe_intermediate_size))
        sizes.append(
            ("shared_expert_intermediate_size", model_config.moe.shared_expert_intermediate_size)
        )
    linear = model_config.linear_attention
    if linear is not None:  # each rank holds whole Gated DeltaNet heads
        sizes.append(("linear_num_key_heads", linear.num_k_heads))
        sizes.append(("linear_num_value_heads", linear.num_v_heads))
    for what, n in sizes:
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


def _shutdown(group: WorkerGroup, ring: ShmRing | None, state: dict) -> None:
    """Stops the workers (this node's, and the other nodes' ranks) and frees the ring and the
    process group; runs once (weakref finalizer: at LLM.shutdown(), garbage collection or
    interpreter exit)."""
    told = False
    remote: RemoteRanks | None = state["remote"]
    if remote is not None:
        remote.close_channel()
    if group.failure is None and state["in_sync"] and state["ready"]:
        try:
            with _deferred_interrupt():
                data = encode(Op.SHUTDOWN)
                if ring is not None:
                    ring.write(data, check=group.check)
                if remote is not None and remote.failure is None:
                    remote.write(data)
            told = True
        except Exception:
            pass  # a worker is gone: reaping below is all that is left
    if remote is not None:
        remote.stop()
    group.stop(grace=10.0 if told else 0.0)
    if ring is not None:
        ring.close()
    release_process_group()


class TPExecutor:
    """The Executor of tensor_parallel_size > 1 when this process starts the workers."""

    def __init__(self, setup: EngineSetup) -> None:
        config = setup.config
        world_size = config.tensor_parallel_size
        local_size = world_size // config.nnodes  # the ranks of this node, rank 0 included
        check_shardable(setup.model_config, world_size)
        if setup.device.type == "cuda" and torch.cuda.device_count() < local_size:
            raise ValueError(
                f"tensor_parallel_size={world_size} over nnodes={config.nnodes} needs "
                f"{local_size} GPUs on this node but only {torch.cuda.device_count()} are visible"
            )
        if dist.is_initialized():
            raise RuntimeError(
                "a torch.distributed process group is already initialized in this process; "
                "shut the other tensor-parallel LLM down first"
            )
        if config.nnodes > 1:
            init_method = rendezvous_address(config)
        else:
            init_method = f"tcp://127.0.0.1:{free_port()}"
        self._ring = ShmRing.create(num_readers=local_size - 1) if local_size > 1 else None
        ring = self._ring.handle if self._ring is not None else None
        specs = [WorkerSpec(setup, r, init_method, ring) for r in range(1, local_size)]
        self._state = {"in_sync": True, "ready": False, "remote": None}
        # Under async scheduling the workers collect a step's tokens at the next sample.
        self._async_scheduling = config.async_scheduling
        try:
            self._group = WorkerGroup(specs, on_failure=_abort_process_group)
        except BaseException:
            if self._ring is not None:
                self._ring.close()
            raise
        self._finalizer = weakref.finalize(self, _shutdown, self._group, self._ring, self._state)
        try:
            # Start-up errors of a worker (imports, device, config) fail here at once.
            self._group.wait_for("up", _STARTUP_TIMEOUT_S)
            device = join_process_group(config, setup.device, 0, init_method, 0)
            if config.nnodes > 1:
                self._state["remote"] = RemoteRanks(setup, on_failure=_abort_process_group)
            self.runner, self.num_blocks = build_runner(setup, device)
            proposer = build_proposer(setup)  # rank 0 drafts: its RunnerOutput is read
            if proposer is not None:
                self.runner.attach_proposer(proposer)
            self._group.wait_for("ready", _STARTUP_TIMEOUT_S)
            self._state["ready"] = True
            if self._state["remote"] is not None:
                self._state["remote"].start_keep_alive()
        except BaseException as e:
            failure = self._failure(explain=not isinstance(e, KeyboardInterrupt))
            self._finalizer()
            if failure is not None and not isinstance(e, KeyboardInterrupt):
                raise RuntimeError(failure) from e
            raise

    @property
    def workers(self) -> list:
        return self._group.procs

    def forward(self, sched_out: SchedulerOutput) -> ForwardStep:
        # Rank 0's proposals fill the step's draft slots before the step travels: the other
        # ranks run the filled step, and read the step in flight first where rank 0 did.
        filled = self.runner.fill_draft_slots(sched_out)
        op = Op.FORWARD_AFTER_READ if filled.read_previous else Op.FORWARD
        send = partial(self._write, encode(op, filled.sched_out))
        return self._run(send, partial(self.runner.launch, filled))

    def sample(self, step: ForwardStep, grammar: GrammarOutput | None) -> StepHandle:
        op = Op.SAMPLE_ASYNC if self._async_scheduling else Op.SAMPLE
        # The other ranks run the filled step: its mask rows are the filled step's.
        sent = None if grammar is None else grammar_for_step(grammar, step.row_map)
        send = partial(send_sample, self._write, op, sent)
        return self._run(send, partial(self.runner.sample, step, grammar))

    def _run(self, send: Callable[[], None], run: Callable[[], T]) -> T:
        """Sends the other ranks a step's message (send), then runs the same call here."""
        if not self._finalizer.alive:
            raise RuntimeError("the tensor-parallel engine has shut down; create a new LLM")
        self._check()
        with _deferred_interrupt():
            errors_before = self._num_step_errors()
            send()
            try:
                return run()
            except Exception as e:
                self._raise_if_failed(e)
                if not self._wait_step_errors(errors_before + 1, _STEP_ERROR_WAIT_S):
                    # Only rank 0 failed: the workers wait in a collective that never comes.
                    self._state["in_sync"] = False
                    self._finalizer()
                    raise RuntimeError(
                        "a tensor-parallel step failed on rank 0 only; the engine has shut "
                        f"down, create a new LLM ({type(e).__name__}: {e})"
                    ) from e
                raise  # it failed on every rank: they are all ready for the next step

    def _write(self, data: bytes | memoryview) -> None:
        """Sends one message to every other rank: this node's through the ring, the other
        nodes' over gloo."""
        try:
            if self._ring is not None:
                self._ring.write(data, check=self._check)
            if self._state["remote"] is not None:
                self._state["remote"].write(data)
        except BaseException as e:
            self._state["in_sync"] = False
            self._raise_if_failed(e)
            raise

    def _check(self) -> None:
        """Raises RuntimeError when a worker of this node or a rank of another has failed."""
        self._group.check()
        if self._state["remote"] is not None:
            self._state["remote"].check()

    def _num_step_errors(self) -> int:
        """How many failed steps every other rank has reported so far."""
        counts = [self._group.num_step_errors()] if self._group.procs else []
        if self._state["remote"] is not None:
            counts.append(self._state["remote"].num_step_errors())
        return min(counts)

    def _wait_step_errors(self, count: int, timeout: float) -> bool:
        """Whether every other rank reports its count-th failed step within timeout."""
        deadline = time.monotonic() + timeout
        while self._num_step_errors() < count:
            if self._failure(explain=False) is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def _failure(self, explain: bool) -> str | None:
        """What failed, or None. explain: a collective just failed, so wait a moment for the
        record of a worker's death (gloo may see the closed socket first) and name the rank."""
        group, remote = self._group, self._state["remote"]
        if explain and group.failure is None and any(p.poll() is not None for p in group.procs):
            deadline = time.monotonic() + 2.0
            while group.failure is None and time.monotonic() < deadline:
                time.sleep(0.01)
        if group.failure is not None:
            return group.failure
        if remote is None:
            return None
        return remote.explain() if explain else remote.failure

    def _raise_if_failed(self, error: BaseException) -> None:
        """A collective that fails because a rank died says so, naming the rank."""
        if isinstance(error, KeyboardInterrupt):
            return
        failure = self._failure(explain=True)
        if failure is not None:
            raise RuntimeError(failure) from error

    def shutdown(self) -> None:
        self._finalizer()
        self.__dict__.pop("runner", None)  # rank 0's model and KV cache (local.py says why)
