"""Executors: where a step's SchedulerOutput runs. The core sees one typed interface.

- LocalExecutor: one process, one device (tensor_parallel_size == 1).
- TPExecutor (engine/tp_executor.py): this process is rank 0 and starts ranks 1..N-1.
- TorchrunExecutor: torchrun started every rank; each runs the whole engine in lockstep.
"""

from __future__ import annotations

import os
from typing import Protocol

import torch

from minivllm.config import EngineConfig, ModelConfig
from minivllm.distributed.teardown import release_process_group
from minivllm.engine.model_runner import ModelRunner
from minivllm.engine.step_handle import StepHandle
from minivllm.engine.types import RunnerOutput, SchedulerOutput


class Executor(Protocol):
    """Runs steps on every device of one engine replica."""

    num_blocks: int  # KV cache blocks per rank (the same on every rank)

    def execute(self, sched_out: SchedulerOutput) -> RunnerOutput:
        """Runs one step and waits for its tokens."""
        ...

    def execute_async(self, sched_out: SchedulerOutput) -> StepHandle:
        """Launches one step; the handle's result() waits for its tokens."""
        ...

    def shutdown(self) -> None:
        """Frees devices and processes; idempotent. The executor cannot run steps after it."""
        ...


class LocalExecutor:
    """One process, one device: tensor_parallel_size == 1."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig, max_model_len: int) -> None:
        device = config.resolved_device()
        dtype = config.resolved_dtype(model_config, device)
        torch.manual_seed(config.seed)
        self.runner = ModelRunner(config, model_config, device, dtype, max_model_len)
        self.num_blocks = self.runner.determine_num_blocks()
        if self.num_blocks >= 1:
            self.runner.initialize_kv_cache(self.num_blocks)

    def execute(self, sched_out: SchedulerOutput) -> RunnerOutput:
        return self.runner.execute(sched_out)

    def execute_async(self, sched_out: SchedulerOutput) -> StepHandle:
        return self.runner.execute_async(sched_out)

    def shutdown(self) -> None:
        pass


def torchrun_rank() -> tuple[int, int, int] | None:
    """(rank, local_rank, world_size) when this process was started by torchrun, else None."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" not in env or "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    return int(env["RANK"]), int(env.get("LOCAL_RANK", env["RANK"])), int(env["WORLD_SIZE"])


class TorchrunExecutor(LocalExecutor):
    """Under torchrun every rank runs the user's script, so every rank builds the same LLM,
    gets the same requests and runs the whole engine: the schedulers agree step by step
    (same inputs, same all-gathered logits, same keyed sampling), and nothing is broadcast.
    Every rank returns the outputs; print them on rank 0 only."""

    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        max_model_len: int,
        rank: int,
        local_rank: int,
        world_size: int,
    ) -> None:
        from minivllm.engine.tp_executor import check_shardable
        from minivllm.engine.worker import init_rank

        if world_size != config.tensor_parallel_size:
            raise ValueError(
                f"torchrun started {world_size} processes but tensor_parallel_size is "
                f"{config.tensor_parallel_size}; they must be equal"
            )
        check_shardable(model_config, world_size)
        self.runner, self.num_blocks = init_rank(
            config, model_config, max_model_len, rank, world_size, "env://", local_rank
        )
        self._closed = False

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            release_process_group()


def build_executor(config: EngineConfig, model_config: ModelConfig, max_model_len: int) -> Executor:
    if config.tensor_parallel_size == 1:
        return LocalExecutor(config, model_config, max_model_len)
    launched = torchrun_rank()
    if launched is not None:
        return TorchrunExecutor(config, model_config, max_model_len, *launched)
    from minivllm.engine.tp_executor import TPExecutor

    return TPExecutor(config, model_config, max_model_len)
