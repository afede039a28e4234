"""LocalExecutor: one process, one device (tensor_parallel_size == 1)."""

from __future__ import annotations

import torch

from minivllm.engine.runner.model_runner import ModelRunner
from minivllm.engine.runner.step_handle import StepHandle
from minivllm.engine.setup import EngineSetup
from minivllm.engine.types import RunnerOutput, SchedulerOutput


class LocalExecutor:
    """One process, one device: tensor_parallel_size == 1."""

    def __init__(self, setup: EngineSetup) -> None:
        torch.manual_seed(setup.config.seed)
        self.runner = ModelRunner(setup, setup.device)
        self.num_blocks = self.runner.determine_num_blocks()
        if self.num_blocks >= 1:
            self.runner.initialize_kv_cache(self.num_blocks)

    def execute(self, sched_out: SchedulerOutput) -> RunnerOutput:
        return self.runner.execute(sched_out)

    def execute_async(self, sched_out: SchedulerOutput) -> StepHandle:
        return self.runner.execute_async(sched_out)

    def shutdown(self) -> None:
        pass
