"""Host time of each phase of minivllm's engine step, measured by wrapping the functions
that make it up with perf_counter timers (no profiler: cProfile roughly doubles the Python
parts and not the native ones, which skews a breakdown). Also counts the steps by how the
forward ran (the decode CUDA graph, piecewise graphs, eager) and the main thread's waits for
the device's results: a run whose waits are near zero is host-bound.

Used by bench_structured.py --phases; install() before the run, report() after it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any


def timed(
    seconds: dict[str, float], owner: Any, name: str, label: str | None = None
) -> Callable[[], None]:
    """Wraps owner.name so that its wall time adds up in seconds[label or name]; returns
    what puts the original back."""
    inner = owner.__dict__[name]
    label = label or name

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            seconds[label] += time.perf_counter() - start

    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, inner)


class StepPhases:
    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        self.step_kinds: Counter[str] = Counter()
        self._undo: list[Callable[[], None]] = []

    def install(self) -> None:
        from minivllm.engine import engine_core
        from minivllm.engine.runner import device_inputs, model_runner
        from minivllm.engine.sched import scheduler
        from minivllm.entrypoints import output_processor
        from minivllm.structured_output import llguidance_backend, manager

        self._time(engine_core.EngineCore, "step")
        self._time(scheduler.Scheduler, "schedule")
        self._time(scheduler.Scheduler, "update")
        self._time(model_runner.ModelRunner, "execute_async")
        self._time(model_runner.ModelRunner, "run_model")
        self._time(device_inputs.HostCopy, "tolist", "wait for the device (HostCopy)")
        self._time(output_processor.OutputProcessor, "process", "output processor")
        for name in ("forced_drafts", "step_bitmask", "advance_grammars", "end_grammar"):
            self._time(scheduler, name)
        self._time(manager.StructuredOutputManager, "fill", "mask fill")
        self._time(manager, "unforced_rows")
        self._time(llguidance_backend.LLGuidanceBackend, "fill_bitmasks", "llguidance masks")
        self._time(llguidance_backend.LLGuidanceBackend, "accept_token_batch", "llguidance advance")
        self._time(model_runner, "apply_bitmask")
        runner = model_runner.ModelRunner
        run_model = runner.run_model

        def counted(runner_self, inputs, sched_out=None, extra_rows=None):
            graphs, mixed = runner_self.graphs, runner_self.mixed_graphs
            num_sampled = len(inputs.logits_indices)
            if (
                extra_rows is None
                and graphs is not None
                and graphs.can_run(inputs.num_tokens, inputs.num_decode_tokens, num_sampled)
            ):
                kind = "decode graph"
            elif mixed is not None and mixed.can_run(inputs.num_tokens):
                kind = "piecewise graphs"
            else:
                kind = "eager"
            self.step_kinds[kind] += 1
            return run_model(runner_self, inputs, sched_out, extra_rows)

        self._set(runner, "run_model", counted)

    def reset(self) -> None:
        self.seconds.clear()
        self.step_kinds.clear()

    def report(self) -> dict[str, Any]:
        """Microseconds a step per phase, and the step kinds. Phases nest: step holds
        schedule, execute_async and the AsyncScheduler's update; "update" is Scheduler.update,
        the application of a step's results, wherever it runs (in the AsyncScheduler's
        update, or inside a constrained step's mask fill, which applies the step in flight
        first); the wait for the device comes before it."""
        steps = max(1, self.num_steps)
        return {
            "steps": self.num_steps,
            "step_kinds": dict(self.step_kinds),
            "host_us_per_step": {
                name: round(seconds * 1e6 / steps) for name, seconds in self.seconds.most_common()
            },
        }

    @property
    def num_steps(self) -> int:
        return sum(self.step_kinds.values())

    def uninstall(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def _time(self, owner: Any, name: str, label: str | None = None) -> None:
        self._undo.append(timed(self.seconds, owner, name, label))

    def _set(self, owner: Any, name: str, value: Any) -> None:
        old = owner.__dict__[name]
        setattr(owner, name, value)
        self._undo.append(lambda: setattr(owner, name, old))
