"""TorchrunExecutor: torchrun started every rank, and each runs the whole engine in lockstep."""

from __future__ import annotations

import os

from minivllm.distributed.teardown import release_process_group
from minivllm.engine.executor.local import LocalExecutor
from minivllm.engine.executor.tp_executor import check_shardable
from minivllm.engine.executor.tp_worker import init_rank
from minivllm.engine.setup import EngineSetup


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

    def __init__(self, setup: EngineSetup, rank: int, local_rank: int, world_size: int) -> None:
        tp_size = setup.config.tensor_parallel_size
        if world_size != tp_size:
            raise ValueError(
                f"torchrun started {world_size} processes but tensor_parallel_size is "
                f"{tp_size}; they must be equal"
            )
        check_shardable(setup.model_config, world_size)
        self.runner, self.num_blocks = init_rank(setup, rank, "env://", local_rank)
        self._closed = False

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            release_process_group()
