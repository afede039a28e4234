"""LocalExecutor: one process, one device (tensor_parallel_size == 1)."""

from __future__ import annotations

import torch

from minivllm.config import EngineConfig, ModelConfig
from minivllm.engine.runner.model_runner import ModelRunner
from minivllm.engine.runner.step_handle import StepHandle
from minivllm.engine.types import RunnerOutput, SchedulerOutput


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
