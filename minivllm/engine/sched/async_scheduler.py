"""AsyncScheduler: async scheduling, step N scheduled and launched before step N - 1's tokens
are applied, so that the host work of one step overlaps the device work of the other."""

from __future__ import annotations

from minivllm.engine.sched.grammar import fill_masks
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.engine.types import (
    EngineOutput,
    GrammarOutput,
    PendingRunnerOutput,
    RunnerOutput,
    SchedulerOutput,
)


class AsyncScheduler(Scheduler):
    """A Scheduler that keeps one launched step in flight.

    update(sched_out, pending) applies the step in flight (N - 1) and keeps `pending` (step N,
    from the executor's sample) in flight instead: a step's outputs come out of the next
    update(). The tokens step N samples enter step N + 1 as placeholders (see Scheduler). A
    step in flight whose requests were all aborted is simply applied (to nothing) by the next
    update.

    A drafting request stays in the next step too: it gets draft slots (placeholders the runner
    fills with the proposals once it has read the step in flight) at positions that assume its
    drafts in flight are all accepted, which the runner and update() correct (speculation.py,
    engine/runner/drafts/draft_slots.py). While some request reads sampled tokens on the host (bad
    words, a thinking budget), or the step in flight asked drafts that the next step must know (a
    constrained request's), can_schedule_ahead is False: catch_up() (the engine calls it before
    schedule(); schedule() calls it too) applies the step in flight, so that the next step starts
    from every token and the drafts, as a synchronous step does. A grammar needs the tokens only for
    the step's masks: grammar_output() applies the step in flight first (its forward is launched by
    then), as vLLM defers the bitmask.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._in_flight: tuple[SchedulerOutput, PendingRunnerOutput] | None = None
        # Outputs of the step applied early (schedule, grammar_output); update() returns them.
        self._early_outputs: list[EngineOutput] = []

    def catch_up(self) -> None:
        if not self.can_schedule_ahead:
            self._apply_early()

    def schedule(self, now: float | None = None) -> SchedulerOutput:
        self.catch_up()
        return super().schedule(now)

    def grammar_output(self, sched_out: SchedulerOutput) -> GrammarOutput | None:
        rows = self._constrained_rows(sched_out)
        if rows is None:
            return None
        self._apply_early()  # the matchers take the step in flight's tokens first
        return fill_masks(rows, self.structured_outputs)

    def _apply_early(self) -> None:
        """Applies the step in flight now; the next update() returns its outputs."""
        self._early_outputs += self._apply_in_flight()

    def update(
        self, sched_out: SchedulerOutput, runner_out: RunnerOutput | PendingRunnerOutput
    ) -> list[EngineOutput]:
        """Applies the step in flight and keeps this one in flight; a RunnerOutput (a step
        already finished) or an empty step is applied at once."""
        outputs, self._early_outputs = self._early_outputs, []
        outputs += self._apply_in_flight()
        if isinstance(runner_out, RunnerOutput):
            outputs += super().update(sched_out, runner_out)
        elif not sched_out.is_empty:  # an empty step only handed finished ids to the runner
            self._in_flight = (sched_out, runner_out)
        return outputs + self.take_failed_outputs()

    def _apply_in_flight(self) -> list[EngineOutput]:
        if self._in_flight is None:
            return []
        sched_out, pending = self._in_flight
        self._in_flight = None
        return super().update(sched_out, pending.result())
