"""LocalExecutor: one process, one device (tensor_parallel_size == 1)."""

from __future__ import annotations

import torch

from minivllm.engine.runner.drafts.proposers import build_proposer
from minivllm.engine.runner.model_runner import ModelRunner
from minivllm.engine.runner.step_handle import ForwardStep, StepHandle
from minivllm.engine.setup import EngineSetup
from minivllm.engine.types import GrammarOutput, SchedulerOutput


class LocalExecutor:
    """One process, one device: tensor_parallel_size == 1."""

    def __init__(self, setup: EngineSetup) -> None:
        torch.manual_seed(setup.config.seed)
        self.runner = ModelRunner(setup, setup.device)
        self.num_blocks = self.runner.determine_num_blocks()
        if self.num_blocks >= 1:
            self.runner.initialize_kv_cache(self.num_blocks)
            proposer = build_proposer(setup)  # speculative decoding's, after the KV cache
            if proposer is not None:
                self.runner.attach_proposer(proposer)

    def forward(self, sched_out: SchedulerOutput) -> ForwardStep:
        return self.runner.forward(sched_out)

    def sample(self, step: ForwardStep, grammar: GrammarOutput | None) -> StepHandle:
        return self.runner.sample(step, grammar)

    def shutdown(self) -> None:
        # The runner holds the weights, the KV cache and the graphs: dropped, its device memory
        # can go back (the next engine's memory_baseline collects and empties the cache).
        self.__dict__.pop("runner", None)
