"""Host time of each phase of minivllm's engine step, measured by wrapping the functions
that make it up with perf_counter timers (no profiler: cProfile roughly doubles the Python
parts and not the native ones, which skews a breakdown). Also counts the steps by how the
forward ran (the decode CUDA graph, piecewise graphs, eager) and the main thread's waits for
the device's results: a run whose waits are near zero is host-bound. The same split by the
step's work (decode rows only, or prefill rows too), and the main thread's CPU time against
the wall time (other threads' CPU shows as the process's excess over it), the cyclic garbage
collector's collections and their time per generation, and on CUDA the caching allocator's
retries and device allocations and frees during the run (each can synchronize the device).

Used by bench_structured.py --phases; install() before the run, report() after it.
"""

from __future__ import annotations

import gc
import os
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
        self.step_kinds: Counter[str] = Counter()
        # The phases of the step under way (and of the output processing after it), then
        # added to its work's: "decode" (decode rows only), "prefill" (prompt rows too),
        # "empty" (no forward). The run's totals are their sum (seconds).
        self._this_step: Counter[str] = Counter()
        self._work = "empty"
        self.by_work: dict[str, Counter[str]] = {}
        self.work_steps: Counter[str] = Counter()
        # _snapshot() at install() and at uninstall(): the report gives their differences.
        self._start: dict[str, float] = {}
        self._end: dict[str, float] | None = None
        self._undo: list[Callable[[], None]] = []
        self.gc = GCTimes()

    def install(self) -> None:
        from minivllm.engine import engine_core
        from minivllm.engine.runner import device_inputs, model_runner
        from minivllm.engine.sched import scheduler
        from minivllm.entrypoints import output_processor
        from minivllm.structured_output import llguidance_backend, manager

        self._time_step(engine_core.EngineCore)
        self._time(scheduler.Scheduler, "schedule")
        self._time(scheduler.Scheduler, "update")
        self._time(model_runner.ModelRunner, "forward")
        self._time(model_runner.ModelRunner, "sample")
        self._time(model_runner.ModelRunner, "run_model")
        self._time(device_inputs.HostCopy, "tolist", "wait for the device (HostCopy)")
        self._time(output_processor.OutputProcessor, "process", "output processor")
        # Functions called once a step only: a wrapper costs a few µs a call, which on one
        # called per request (end_grammar) would add more to its phase than it measures.
        for name in ("forced_drafts", "constrained_rows", "advance_grammars"):
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
            self._work = "prefill" if inputs.num_tokens > inputs.num_decode_tokens else "decode"
            return run_model(runner_self, inputs, sched_out, extra_rows)

        self._set(runner, "run_model", counted)
        gc.callbacks.append(self.gc.record)
        self._undo.append(lambda: gc.callbacks.remove(self.gc.record))
        self._start, self._end = _snapshot(), None

    def report(self) -> dict[str, Any]:
        """Microseconds a step per phase, and the step kinds. Phases nest: step holds schedule,
        forward, the mask fill, sample and the AsyncScheduler's update; "update" is
        Scheduler.update, the application of a step's results, wherever it runs (in the
        AsyncScheduler's update, or in a constrained step's grammar_output, which applies the step
        in flight before the fill); the wait for the device comes before it. by_work: the same by
        the step's work, the step's own microseconds and its count first. cpu_s: the run's wall
        time, the main thread's CPU time and the process's (from install() to uninstall(), or to
        this report). gc: per generation, the collections and their milliseconds over the same span.
        cuda_allocator: the allocator's counts over the same span (CUDA only)."""
        end = self._end or _snapshot()
        spent = {name: end[name] - self._start[name] for name in end}
        cpu = {name: round(spent.pop(name), 2) for name in ("wall", "main", "process")}
        result = {
            "steps": self.num_steps,
            "step_kinds": dict(self.step_kinds),
            "host_us_per_step": _per_step(self.seconds, self.num_steps),
            "by_work": {
                work: {"steps": self.work_steps[work]} | _per_step(seconds, self.work_steps[work])
                for work, seconds in self.by_work.items()
            },
            "cpu_s": cpu,
            "gc": self.gc.report(),
        }
        if spent:  # what is left: the allocator's counts (CUDA)
            result["cuda_allocator"] = {name: int(count) for name, count in spent.items()}
        return result

    @property
    def seconds(self) -> Counter[str]:
        """Seconds of each phase over the run: every step's work, and what ran since the last."""
        return sum(self.by_work.values(), Counter()) + self._this_step

    @property
    def num_steps(self) -> int:
        return sum(self.step_kinds.values())

    def uninstall(self) -> None:
        self._end = _snapshot()
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def _time(self, owner: Any, name: str, label: str | None = None) -> None:
        self._undo.append(timed(self._this_step, owner, name, label))

    def _time_step(self, core_class: Any) -> None:
        """Times EngineCore.step, then files the step's phases under its work."""
        self._time(core_class, "step")
        timed_step = core_class.__dict__["step"]

        def file_under(work: str) -> None:
            self.by_work.setdefault(work, Counter()).update(self._this_step)
            self._this_step.clear()

        def step(core, *args, **kwargs):
            file_under(self._work)  # what ran between steps (outputs) is the last step's
            self._work = "empty"
            try:
                return timed_step(core, *args, **kwargs)
            finally:
                file_under(self._work)
                self.work_steps[self._work] += 1

        self._set(core_class, "step", step)

    def _set(self, owner: Any, name: str, value: Any) -> None:
        old = owner.__dict__[name]
        setattr(owner, name, value)
        self._undo.append(lambda: setattr(owner, name, old))


class GCTimes:
    """The cyclic GC's collections and their time, per generation (a gc.callbacks entry)."""

    def __init__(self) -> None:
        self.collections: Counter[int] = Counter()
        self.seconds: Counter[int] = Counter()
        self._started = 0.0

    def record(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.collections[info["generation"]] += 1
            self.seconds[info["generation"]] += time.perf_counter() - self._started

    def report(self) -> dict[str, dict[str, float]]:
        return {
            str(gen): {"collections": n, "ms": round(self.seconds[gen] * 1e3, 1)}
            for gen, n in sorted(self.collections.items())
        }


def _per_step(seconds: Counter[str], steps: int) -> dict[str, int]:
    """Microseconds a step of each phase, largest first."""
    steps = max(1, steps)
    return {name: round(total * 1e6 / steps) for name, total in seconds.most_common()}


def _snapshot() -> dict[str, float]:
    """The clocks and counts the report gives as differences: wall, main-thread and process
    CPU seconds; with CUDA, the caching allocator's retries (an allocation that failed, freed
    its cache and tried again), device allocations and frees, and syncs of all streams."""
    import torch

    times = os.times()
    snapshot = {
        "wall": time.perf_counter(),
        "main": time.thread_time(),
        "process": times.user + times.system,
    }
    if torch.cuda.is_available():
        stats = torch.cuda.memory_stats()
        for name in ("num_alloc_retries", "num_device_alloc", "num_device_free",
                     "num_sync_all_streams"):  # fmt: skip
            snapshot[name] = stats.get(name, 0)
    return snapshot
