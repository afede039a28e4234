"""PoolingRunner on made-up hidden states: chunks across steps, a preemption that recomputes
a prompt from position 0, last / mean / cls, cut and normalised, scores; mean pooling's sum
the same bits however chunked; the bytes the runner holds within its memory reserve."""

from __future__ import annotations

import numpy as np
import torch

from minivllm.engine.runner.pooling import PoolingRunner, pooled_to_host, pooling_reserve_bytes
from minivllm.engine.sched.limits import auto_scheduler_limits
from minivllm.engine.types import NewRequestData, ScheduledChunk, SchedulerOutput
from minivllm.pooling.mean_sum import SEGMENT_ROWS, SLAB_ROWS, MeanSum, mean_sum_bytes
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


def test_mean_sum_same_bits_however_chunked() -> None:
    """Segments that chunks cut, chunks longer than a slab, bf16 rows: one sum's bits."""
    rows = torch.randn(2 * SLAB_ROWS + 150, 16, generator=torch.Generator().manual_seed(1))
    for dtype in (torch.float32, torch.bfloat16):
        x = rows.to(dtype)
        means = []
        for cuts in ([], [1, 64, 65, 200], list(range(7, len(x), 7)), [SLAB_ROWS + 3]):
            mean_sum = MeanSum()
            for piece in torch.tensor_split(x, cuts):
                mean_sum.add(piece)
            means.append(mean_sum.mean())
        assert all(torch.equal(m, means[0]) for m in means)
        torch.testing.assert_close(means[0], x.double().mean(0).float(), atol=1e-6, rtol=1e-5)


def _held_bytes(runner: PoolingRunner) -> int:
    """The bytes behind the tensors the runner keeps between steps (whole storages: a view
    keeps its base alive)."""
    tensors = list(runner._firsts.values())
    for mean_sum in runner._means.values():
        tensors += [t for t in (mean_sum.total, mean_sum.pending) if t is not None]
    return sum(t.untyped_storage().nbytes() for t in tensors)


def test_reserve_bounds_the_worst_seats() -> None:
    """Every seat a mean request that stopped a row short of a segment's end, after a chunk of
    many segments: what the runner holds stays within its share of pooling_reserve_bytes; a
    preempted request's state goes with its preemption."""
    num_seqs, hidden_size = 3, 256
    runner = PoolingRunner(lambda h: h)
    mean = PoolingParams("embed", "mean", False)
    news = [NewRequestData(f"m{i}", [1] * 4096, SamplingParams(max_tokens=1, pooling=mean))
            for i in range(num_seqs)]  # fmt: skip
    sched_out = SchedulerOutput(
        [ScheduledChunk(n.req_id, [1] * (3 * SEGMENT_ROWS - 1), 0, [], 0, False) for n in news],
        0, news,
    )  # fmt: skip
    runner.update(sched_out)
    hidden = torch.randn(sched_out.num_tokens, hidden_size, dtype=torch.bfloat16)
    runner.pool(hidden, np.arange(num_seqs) * (3 * SEGMENT_ROWS - 1), sched_out)
    held, _ = mean_sum_bytes(hidden_size, torch.bfloat16)
    assert _held_bytes(runner) == num_seqs * held
    assert pooling_reserve_bytes(hidden_size, torch.bfloat16, num_seqs) > num_seqs * held
    runner.update(SchedulerOutput([], 0, preempted_req_ids=["m0"]))
    assert _held_bytes(runner) == (num_seqs - 1) * held and runner.active


def test_reserve_at_the_largest_default_limits() -> None:
    """The memory profile's pooling reserve (pooling_reserve_bytes) at the largest default
    limits, for Qwen3-8B's hidden size in bf16: every seat's worst case, under 1 GiB."""
    limits = auto_scheduler_limits(80 * 2**30, "cuda", "offline", "NVIDIA H100 80GB HBM3")
    hidden_size, dtype = 4096, torch.bfloat16
    reserve = pooling_reserve_bytes(hidden_size, dtype, limits.max_num_seqs)
    held, workspace = mean_sum_bytes(hidden_size, dtype)
    per_row = hidden_size * 2
    assert held >= (SEGMENT_ROWS - 1) * per_row and workspace >= SLAB_ROWS * per_row
    assert limits.max_num_seqs * held + workspace < reserve < 2**30
