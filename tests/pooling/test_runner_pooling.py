"""PoolingRunner on made-up hidden states: chunks across steps, a preemption that recomputes
a prompt from position 0, last / mean / cls, cut and normalised, scores."""

from __future__ import annotations

import numpy as np
import torch

from minivllm.engine.runner.pooling import PoolingRunner, pooled_to_host
from minivllm.engine.types import NewRequestData, ScheduledChunk, SchedulerOutput
from minivllm.pooling.params import PoolingParams
from minivllm.sampling_params import SamplingParams

HIDDEN = torch.randn(20, 8, generator=torch.Generator().manual_seed(0))


def _step(runner: PoolingRunner, chunks: list[tuple[str, int, int, bool]], new=()) -> dict:
    """Runs one step of chunks (req_id, first position, length, ends the prompt) whose rows
    are HIDDEN's rows at those positions; returns the pooled results."""
    scheduled = [ScheduledChunk(r, [1] * n, start, [], 0, last) for r, start, n, last in chunks]
    sched_out = SchedulerOutput(scheduled, 0, list(new))
    runner.update(sched_out)
    hidden = torch.cat([HIDDEN[start : start + n] for _, start, n, _ in chunks])
    starts = np.cumsum([0] + [n for _, _, n, _ in chunks])[:-1]
    runner.pool(hidden, starts, sched_out)
    return pooled_to_host(runner.take_results())


def _new(req_id: str, params: PoolingParams) -> NewRequestData:
    return NewRequestData(req_id, [1] * 20, SamplingParams(max_tokens=1, pooling=params))


def test_mean_cls_last_across_chunks_and_a_preemption() -> None:
    runner = PoolingRunner(lambda h: h)
    kinds = {"m": PoolingParams("embed", "mean", False), "c": PoolingParams("embed", "cls", False),
             "l": PoolingParams("embed", "last", True, 4)}  # fmt: skip
    news = [_new(r, p) for r, p in kinds.items()]
    assert _step(runner, [(r, 0, 8, False) for r in kinds], news) == {}
    # "m" and "c" are preempted and start again from 0; "l" goes on.
    assert _step(runner, [("m", 0, 6, False), ("c", 0, 6, False), ("l", 8, 4, False)]) == {}
    out = _step(runner, [("m", 6, 14, True), ("c", 6, 14, True), ("l", 12, 8, True)])
    torch.testing.assert_close(torch.tensor(out["m"]), HIDDEN.mean(0))
    torch.testing.assert_close(torch.tensor(out["c"]), HIDDEN[0])
    want = torch.nn.functional.normalize(HIDDEN[19, :4], dim=0)
    torch.testing.assert_close(torch.tensor(out["l"]), want)


def test_scores_and_forgetting() -> None:
    runner = PoolingRunner(lambda h: h)  # "logits": the hidden rows themselves
    params = PoolingParams("score", "last", False, None, (2, 5))
    out = _step(runner, [("s", 0, 20, True)], [_new("s", params)])
    assert out["s"] == [torch.sigmoid(HIDDEN[19, 5] - HIDDEN[19, 2]).item()]
    runner.update(SchedulerOutput([], 0, finished_req_ids=["s"]))
    assert not runner.active
