"""The runner's side of pooling requests (minivllm/pooling/): which live requests pool, the
running sums of mean pooling and the first rows of cls pooling across a prompt's chunks, and
the pooled vectors (or scores) of the prompts that end in a step, which its handle carries;
the bytes all that may take, counted before the KV cache is sized.

A pooling request is scheduled as a prompt with max_tokens=1: its last chunk samples a token
that ends it, and its output is what pool() read from that step's hidden states.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from minivllm.engine.types import SchedulerOutput
from minivllm.pooling.mean_sum import MeanSum, mean_sum_bytes
from minivllm.pooling.ops import truncate_normalize, yes_no_scores
from minivllm.pooling.params import PoolingParams


class PoolingRunner:
    """Per-request pooling state of one runner. Its memory (pooling_reserve_bytes): a live
    cls request's first row; a live mean request's MeanSum (a running sum and fewer than a
    segment's rows: the same bits however the prompt was chunked). A request's state goes
    when its prompt ends, when it is preempted and when it finishes."""

    def __init__(self, compute_logits: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.compute_logits = compute_logits
        self.params: dict[str, PoolingParams] = {}
        self._means: dict[str, MeanSum] = {}
        self._firsts: dict[str, torch.Tensor] = {}  # cls: the first row, float32 [hidden]
        # The step's results until take_results(): (req_ids, [n, d] vectors or [n] scores).
        self._results: list[tuple[list[str], torch.Tensor]] = []

    def update(self, sched_out: SchedulerOutput) -> None:
        """Forgets finished requests and preempted ones' rows (they start again from
        position 0), registers the step's new pooling requests."""
        for req_id in sched_out.finished_req_ids:
            self.params.pop(req_id, None)
        for req_id in sched_out.finished_req_ids + sched_out.preempted_req_ids:
            self._means.pop(req_id, None)
            self._firsts.pop(req_id, None)
        for new in sched_out.new_requests:
            if new.sampling_params.pooling is not None:
                self.params[new.req_id] = new.sampling_params.pooling

    @property
    def active(self) -> bool:
        return bool(self.params)

    def pool(
        self, hidden: torch.Tensor, chunk_start_loc: np.ndarray, sched_out: SchedulerOutput
    ) -> None:
        """Reads the step's pooling chunks from hidden [num_tokens, hidden_size] (the model's
        final normed states); the prompts that end here get their vector or score."""
        ended: list[tuple[str, PoolingParams, int]] = []  # (req_id, params, last row)
        for i, chunk in enumerate(sched_out.chunks):
            params = self.params.get(chunk.req_id)
            if params is None:
                continue
            start = int(chunk_start_loc[i])
            end = start + len(chunk.token_ids)
            if params.needs_all_rows:
                self._accumulate(chunk.req_id, params, chunk.num_computed_tokens, hidden[start:end])
            if chunk.sample:  # the prompt's last chunk
                ended.append((chunk.req_id, params, end - 1))
        if ended:
            self._results += self._finish(hidden, ended)

    def _accumulate(
        self, req_id: str, params: PoolingParams, first_pos: int, rows: torch.Tensor
    ) -> None:
        # A prompt is computed from position 0 (no prefix hit, needs_all_rows; again from 0
        # after a preemption), so a chunk at 0 starts the request's state anew.
        # Copies: a piecewise graph's hidden states are its static buffer, rewritten next step.
        if params.pooling_type == "cls":
            if first_pos == 0:
                self._firsts[req_id] = rows[0].to(torch.float32, copy=True)
            return
        if first_pos == 0:
            self._means[req_id] = MeanSum()
        assert self._means[req_id].num_rows == first_pos
        self._means[req_id].add(rows)

    def _finish(
        self, hidden: torch.Tensor, ended: list[tuple[str, PoolingParams, int]]
    ) -> list[tuple[list[str], torch.Tensor]]:
        """The vectors and scores of the ended prompts, grouped by how they are finished."""
        groups: dict[tuple, list[tuple[str, PoolingParams, int]]] = {}
        for item in ended:
            params = item[1]
            key = ("score",) if params.task == "score" else (params.dimensions, params.normalize)
            groups.setdefault(key, []).append(item)
        results = []
        for key, items in groups.items():
            req_ids = [req_id for req_id, _, _ in items]
            rows = torch.tensor([row for _, _, row in items], device=hidden.device)
            if key == ("score",):
                ids = torch.tensor([p.score_token_ids for _, p, _ in items], device=hidden.device)
                results.append((req_ids, yes_no_scores(self.compute_logits(hidden[rows]), ids)))
                continue
            vectors = hidden[rows].float()
            for j, (req_id, params, _) in enumerate(items):
                if params.pooling_type == "mean":
                    vectors[j] = self._means.pop(req_id).mean()
                elif params.pooling_type == "cls":
                    vectors[j] = self._firsts.pop(req_id)
            results.append((req_ids, truncate_normalize(vectors, *key)))
        return results

    def take_results(self) -> list[tuple[list[str], torch.Tensor]]:
        """The pooled results of the step just run (empty for most steps), which its handle
        carries to the host (StepHandle.pooled)."""
        results, self._results = self._results, []
        return results


def pooling_reserve_bytes(hidden_size: int, dtype: torch.dtype, max_num_seqs: int) -> int:
    """The most bytes a PoolingRunner takes: every seat's request a mean one with a segment's
    rows but one held (MeanSum), one call's workspace, and a step's ended prompts' vectors
    (their rows gathered, in float32, cut and normalised). A preempted or finished request
    frees its state before the step that gives its seat away."""
    held, workspace = mean_sum_bytes(hidden_size, dtype)
    item = torch.empty(0, dtype=dtype).element_size()
    finishing = max_num_seqs * hidden_size * (item + 2 * 4)
    return max_num_seqs * held + workspace + finishing


def pooled_to_host(results: list[tuple[list[str], torch.Tensor]]) -> dict[str, list[float]]:
    """take_results()'s tensors as RunnerOutput.pooled: req_id -> its vector or [score]."""
    pooled = {}
    for req_ids, values in results:
        for req_id, value in zip(req_ids, values.tolist(), strict=True):
            pooled[req_id] = value if isinstance(value, list) else [value]
    return pooled
