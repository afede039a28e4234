"""The Executor protocol: where a step's SchedulerOutput runs. The core sees one typed
interface whatever the devices (executor/build.py picks one)."""

from __future__ import annotations

from typing import Protocol

from minivllm.engine.runner.step_handle import ForwardStep, StepHandle
from minivllm.engine.types import GrammarOutput, SchedulerOutput


class Executor(Protocol):
    """Runs steps on every device of one engine replica, each in two calls: forward, then
    sample (the scheduler fills the step's grammar masks between them)."""

    num_blocks: int  # KV cache blocks per rank (the same on every rank)

    def forward(self, sched_out: SchedulerOutput) -> ForwardStep:
        """Launches the step's forward on every device and returns at once."""
        ...

    def sample(self, step: ForwardStep, grammar: GrammarOutput | None) -> StepHandle:
        """Masks (grammar) and samples the step's logits; the handle's result() waits for
        its tokens."""
        ...

    def shutdown(self) -> None:
        """Frees devices and processes; idempotent. The executor cannot run steps after it."""
        ...
