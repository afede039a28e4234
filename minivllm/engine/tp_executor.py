"""Tensor parallelism: rank 0 (this process) schedules and samples; ranks 1..N-1 are worker
processes the executor spawns. Each step's SchedulerOutput goes to every rank over a gloo
process group; every rank runs the model on its shard (NCCL on CUDA, gloo on the CPU).

Under `torchrun` the same code spans nodes: the process group comes from the environment
(see docs/parallelism.md).
"""

from __future__ import annotations

import datetime
import logging
import multiprocessing as mp
import os
import socket
import sys
import weakref

import torch
import torch.distributed as dist

from minivllm.config import EngineConfig, ModelConfig
from minivllm.engine.model_runner import ModelRunner
from minivllm.engine.types import RunnerOutput, SchedulerOutput

logger = logging.getLogger(__name__)

# A step that takes longer than this on any rank means a rank is gone.
_COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_rank() -> tuple[int, int, int] | None:
    """(rank, local_rank, world_size) when this process was started by torchrun, else None."""
    if "TORCHELASTIC_RUN_ID" not in os.environ and "MASTER_ADDR" not in os.environ:
        return None
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    env = os.environ
    return int(env["RANK"]), int(env.get("LOCAL_RANK", env["RANK"])), int(env["WORLD_SIZE"])


def _init_rank(
    config: EngineConfig,
    model_config: ModelConfig,
    max_model_len: int,
    rank: int,
    world_size: int,
    init_method: str,
    local_rank: int,
):
    """Joins the process groups and builds this rank's runner with its KV cache."""
    device = config.resolved_device()
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        init_method=init_method,
        world_size=world_size,
        rank=rank,
        timeout=_COLLECTIVE_TIMEOUT,
    )
    # The control plane (SchedulerOutputs) always travels on the CPU.
    control = dist.new_group(backend="gloo", timeout=_COLLECTIVE_TIMEOUT)
    torch.manual_seed(config.seed)
    dtype = config.resolved_dtype(model_config, device)
    runner = ModelRunner(config, model_config, device, dtype, max_model_len, tp_size=world_size)
    num_blocks = torch.tensor([runner.determine_num_blocks()])
    dist.all_reduce(num_blocks, op=dist.ReduceOp.MIN, group=control)
    if num_blocks.item() >= 1:
        runner.initialize_kv_cache(int(num_blocks.item()))
    return runner, control, int(num_blocks.item())


def _worker_main(config, model_config, max_model_len, rank, world_size, port) -> None:
    runner, control, _ = _init_rank(
        config, model_config, max_model_len, rank, world_size, f"tcp://127.0.0.1:{port}", rank
    )
    _serve_steps(runner, control)


def _serve_steps(runner: ModelRunner, control) -> None:
    """A worker rank's loop: run every step rank 0 broadcasts until it sends None."""
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=control)
        sched_out = box[0]
        if sched_out is None:
            break
        if not sched_out.is_empty:
            runner.compute_logits(runner.prepare(sched_out))
        else:
            runner.block_table.update(sched_out)  # forget finished requests
    dist.destroy_process_group()


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


class TPExecutor:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, max_model_len: int) -> None:
        world_size = config.tensor_parallel_size
        check_shardable(model_config, world_size)
        launched = torchrun_rank()
        if launched is not None:
            self._join_torchrun(config, model_config, max_model_len, *launched)
            return
        if config.resolved_device().type == "cuda" and torch.cuda.device_count() < world_size:
            raise ValueError(
                f"tensor_parallel_size={world_size} but only {torch.cuda.device_count()} GPUs "
                "are visible"
            )
        port = free_port()
        ctx = mp.get_context("spawn")
        self.workers = [
            ctx.Process(
                target=_worker_main,
                args=(config, model_config, max_model_len, rank, world_size, port),
                daemon=True,
                name=f"minivllm-tp{rank}",
            )
            for rank in range(1, world_size)
        ]
        for worker in self.workers:
            worker.start()
        self._closed = False
        self._finalizer = weakref.finalize(self, TPExecutor._reap, list(self.workers))
        try:
            self.runner, self.control, self.num_blocks = _init_rank(
                config, model_config, max_model_len, 0, world_size, f"tcp://127.0.0.1:{port}", 0
            )
        except BaseException:
            self._closed = True
            self.shutdown()  # no orphan workers, no process group left behind
            raise

    def _join_torchrun(self, config, model_config, max_model_len, rank, local_rank, world_size):
        """Under torchrun every rank constructs the LLM: rank 0 returns and drives it; the
        other ranks serve steps inside this call and exit their process at shutdown."""
        if world_size != config.tensor_parallel_size:
            raise ValueError(
                f"torchrun started {world_size} processes but tensor_parallel_size is "
                f"{config.tensor_parallel_size}; they must be equal"
            )
        self.workers = []  # torchrun owns the processes
        self._closed = False
        self.runner, self.control, self.num_blocks = _init_rank(
            config, model_config, max_model_len, rank, world_size, "env://", local_rank
        )
        if rank != 0:
            _serve_steps(self.runner, self.control)
            sys.exit(0)

    def _check_workers(self) -> None:
        for rank, worker in enumerate(self.workers, start=1):
            if not worker.is_alive():
                self._closed = True
                raise RuntimeError(
                    f"tensor-parallel worker rank {rank} (pid {worker.pid}) died with exit code "
                    f"{worker.exitcode}; the engine cannot continue, create a new LLM"
                )

    def execute(self, sched_out: SchedulerOutput) -> RunnerOutput:
        if self._closed:
            raise RuntimeError("the tensor-parallel engine has shut down")
        self._check_workers()
        try:
            dist.broadcast_object_list([sched_out], src=0, group=self.control)
            return self.runner.execute(sched_out)
        except RuntimeError as e:
            self._check_workers()
            raise RuntimeError(f"tensor-parallel step failed: {e}") from e

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._check_workers()
                dist.broadcast_object_list([None], src=0, group=self.control)
            except RuntimeError:
                pass  # a worker is gone: nothing to tell it
            for worker in self.workers:
                worker.join(timeout=30)
        TPExecutor._reap(self.workers)
        if dist.is_initialized():
            dist.destroy_process_group()

    @staticmethod
    def _reap(workers: list) -> None:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
                worker.join(timeout=5)
            if worker.is_alive():
                worker.kill()
