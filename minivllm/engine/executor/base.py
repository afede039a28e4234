"""The Executor protocol: where a step's SchedulerOutput runs. The core sees one typed
interface whatever the devices (executor/build.py picks one)."""

from __future__ import annotations

from typing import Protocol

from minivllm.engine.runner.step_handle import StepHandle
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
