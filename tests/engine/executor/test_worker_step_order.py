"""A TP worker's order of calls (tp_worker.serve_steps), which must be rank 0's: under async
scheduling it launches step N + 1 and then collects step N, but where rank 0 read step N to fill
step N + 1's draft slots (FORWARD_AFTER_READ) it collects step N first, so that its sampling
state holds step N's tokens (and gives back its rejected drafts' draws) before it samples."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from minivllm.engine.executor.step_codec import Op, encode, encode_sample
from minivllm.engine.executor.tp_worker import serve_steps
from minivllm.engine.types import ScheduledChunk, SchedulerOutput


class _Runner:
    """Records the calls serve_steps makes; each step is named by its chunk's req_id."""

    def __init__(self) -> None:
        self.device = SimpleNamespace(type="cpu")
        self.limits = SimpleNamespace(max_num_seqs=4)
        self.calls: list[str] = []

    def forward(self, sched_out: SchedulerOutput) -> str:
        name = sched_out.chunks[0].req_id
        self.calls.append(f"forward {name}")
        return name

    def sample(self, step: str, grammar) -> SimpleNamespace:
        self.calls.append(f"sample {step}")
        return SimpleNamespace(result=lambda: self.calls.append(f"result {step}"))


def _step(name: str) -> SchedulerOutput:
    return SchedulerOutput([ScheduledChunk(name, [1], 0, [0], 0, True)], 1)


@pytest.mark.parametrize("second", [Op.FORWARD, Op.FORWARD_AFTER_READ])
def test_worker_collects_the_step_in_flight_where_rank_0_did(second: Op) -> None:
    messages = iter([
        encode(Op.FORWARD, _step("n")),
        encode_sample(Op.SAMPLE_ASYNC, None),
        encode(second, _step("n+1")),
        encode_sample(Op.SAMPLE_ASYNC, None),
        encode(Op.SHUTDOWN),
    ])  # fmt: skip
    runner = _Runner()
    errors: list[tuple] = []
    serve_steps(runner, SimpleNamespace(read=lambda: next(messages)), errors.append)
    assert not errors
    if second == Op.FORWARD:  # launched first, then the step before collected
        expected = ["forward n+1", "sample n+1", "result n", "result n+1"]
    else:
        expected = ["result n", "forward n+1", "sample n+1", "result n+1"]
    assert runner.calls == ["forward n", "sample n", *expected]
