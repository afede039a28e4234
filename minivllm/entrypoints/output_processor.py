"""Turns the core's token-level EngineOutputs into RequestOutputs with text.

It owns everything text-side per request: the incremental detokenizer, stop strings, the
fan-out of `n` samples into child requests and their gathering back into one output.
Shared by LLM.generate and the async server engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from minivllm.engine.types import EngineOutput
from minivllm.entrypoints.processing import (
    IncrementalDetokenizer,
    TokenTexts,
    bad_words_token_ids,
    think_marker_ids,
)
from minivllm.entrypoints.routed_rows import RoutedRows
from minivllm.outputs import CompletionOutput, LogprobsDict, RequestMetrics, RequestOutput
from minivllm.sampling_params import SamplingParams


@dataclass
class _Child:
    """One of the n samples of a request; the core knows it as its own request."""

    index: int
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    # Without stop strings or streaming, text is decoded once at the end: cheaper per step.
    incremental: bool
    # enable_return_routed_experts: the core's routed-experts rows, in position order.
    routed_experts: RoutedRows
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[LogprobsDict] | None = None
    # vLLM's: the sum of the sampled tokens' logprobs; kept when logprobs are asked for.
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class _Parent:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: dict[str, _Child]
    metrics: RequestMetrics
    prompt_logprobs: list[LogprobsDict | None] | None = None
    pooled: list[float] | None = None  # a pooling request's vector or [score]
    # Counted, not recomputed: finished is read for every request every step.
    num_unfinished: int = 0

    @property
    def finished(self) -> bool:
        return self.num_unfinished == 0


class OutputProcessor:
    def __init__(self, tokenizer, stream: bool = False) -> None:
        self.tokenizer = tokenizer
        self.token_texts = TokenTexts(tokenizer)
        self.stream = stream
        self._think_markers: list[list[int]] | None = None  # worked out at first use
        self.parents: dict[str, _Parent] = {}
        self.child_to_parent: dict[str, str] = {}

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float,
    ) -> list[tuple[str, SamplingParams]]:
        """Registers a request; returns the (core request id, params) of each of its n samples."""
        if request_id in self.parents:
            raise ValueError(f"request id {request_id!r} is already in use")
        if params.bad_words:
            params = params.derive(
                bad_words_token_ids=bad_words_token_ids(params.bad_words, self.tokenizer)
            )
        if params.thinking_token_budget is not None:
            if self._think_markers is None:
                self._think_markers = think_marker_ids(self.tokenizer)
            params = params.derive(think_marker_ids=self._think_markers)
        children: dict[str, _Child] = {}
        for index in range(params.n):
            child_id = request_id if params.n == 1 else f"{index}_{request_id}"
            # The prompt is scored once, by the first sample (the parent reports it once).
            prompt_logprobs = params.prompt_logprobs if index == 0 else None
            seed = params.seed
            if seed is not None:
                # Each sample its own seed stream (so that n > 1 with a seed differs per
                # sample), wrapped into int64; -1 stays a seed (derive() does not validate).
                seed = (seed + index + 2**63) % 2**64 - 2**63
            child_params = params.derive(n=1, prompt_logprobs=prompt_logprobs, seed=seed)
            children[child_id] = _Child(
                index=index,
                params=child_params,
                detokenizer=IncrementalDetokenizer(
                    self.tokenizer,
                    prompt_token_ids,
                    skip_special_tokens=params.skip_special_tokens,
                    stop=params.stop,
                    include_stop_str_in_output=params.include_stop_str_in_output,
                ),
                incremental=self.stream or bool(params.stop),
                logprobs=[] if params.logprobs is not None else None,
                cumulative_logprob=0.0 if params.logprobs is not None else None,
                routed_experts=RoutedRows(_max_routed_rows(prompt_token_ids, params)),
            )
            self.child_to_parent[child_id] = request_id
        self.parents[request_id] = _Parent(
            request_id,
            prompt,
            prompt_token_ids,
            children,
            RequestMetrics(arrival_time),
            num_unfinished=len(children),
        )
        return [(child_id, child.params) for child_id, child in children.items()]

    def process(self, engine_outputs: list[EngineOutput]) -> tuple[list[RequestOutput], list[str]]:
        """Applies one step's outputs. Returns (outputs of the requests that changed, or only
        of those that finished when not streaming; core request ids to abort because a stop
        string ended them)."""
        now = time.time()
        to_abort: list[str] = []
        changed: dict[str, _Parent] = {}
        new_logprobs: list[LogprobsDict] = []  # the step's, their texts filled after the loop
        for out in engine_outputs:
            parent_id = self.child_to_parent.get(out.req_id)
            if parent_id is None:
                continue
            parent = self.parents[parent_id]
            child = parent.children[out.req_id]
            if child.finish_reason is not None:
                continue
            self._apply(parent, child, out, now, new_logprobs)
            if child.finish_reason is not None:
                parent.num_unfinished -= 1
            if child.detokenizer.stopped and not out.finished:
                to_abort.append(out.req_id)
            changed[parent_id] = parent
        if new_logprobs:
            self.token_texts.fill(new_logprobs)
        results = []
        for parent in changed.values():
            finished = parent.finished
            if finished:
                parent.metrics.finished_time = now
                for child_id in parent.children:
                    del self.child_to_parent[child_id]
                del self.parents[parent.request_id]
            # Without streaming nobody looks at unfinished outputs: don't build them.
            if finished or self.stream:
                results.append(self._request_output(parent))
        return results, to_abort

    def abort(self, request_id: str) -> list[str]:
        """Forgets a request; returns the core ids of its samples (for the core to abort)."""
        parent = self.parents.pop(request_id, None)
        if parent is None:
            return []
        for child_id in parent.children:
            self.child_to_parent.pop(child_id, None)
        return list(parent.children)

    def abort_all(self) -> list[str]:
        """Forgets every request; returns the core ids of all their samples."""
        core_ids = list(self.child_to_parent)
        self.parents.clear()
        self.child_to_parent.clear()
        return core_ids

    def _apply(
        self,
        parent: _Parent,
        child: _Child,
        out: EngineOutput,
        now: float,
        new_logprobs: list[LogprobsDict],
    ) -> None:
        """Applies out to its sample; the logprob dicts it adds (their texts still to fill)
        go to new_logprobs too."""
        if parent.metrics.first_scheduled_time is None:
            parent.metrics.first_scheduled_time = out.first_scheduled_time
        if parent.metrics.first_token_time is None and out.new_token_ids:
            parent.metrics.first_token_time = now
        parent.metrics.num_draft_tokens += out.num_draft_tokens
        parent.metrics.num_accepted_tokens += out.num_accepted_tokens
        parent.metrics.num_cached_tokens = max(
            parent.metrics.num_cached_tokens, out.num_cached_tokens
        )
        detokenize = child.params.detokenize
        if out.prompt_logprobs is not None:
            parent.prompt_logprobs = (parent.prompt_logprobs or []) + out.prompt_logprobs
            if detokenize:
                new_logprobs.extend(d for d in out.prompt_logprobs if d is not None)
        if out.pooled is not None:
            parent.pooled = out.pooled
        child.token_ids.extend(out.new_token_ids)
        if out.routed_experts is not None:
            child.routed_experts.append(out.routed_experts)
        if child.logprobs is not None and out.new_logprobs:
            child.logprobs.extend(out.new_logprobs)
            if detokenize:
                new_logprobs.extend(out.new_logprobs)
            child.cumulative_logprob += sum(
                d[t].logprob for t, d in zip(out.new_token_ids, out.new_logprobs)
            )
        # A core stop ("stop") on an EOS or stop token id leaves that token's text out; a
        # grammar's end (structured outputs) is a stop on an ordinary token, which stays.
        by_token = out.finished and out.finish_reason == "stop" and _ends_on_stop_token(out, child)
        # Without detokenize no text at all (nor stop strings: SamplingParams refuses them).
        if detokenize and child.incremental:
            child.detokenizer.add_tokens(out.new_token_ids, out.finished, by_token)
        elif detokenize and out.finished:
            child.detokenizer.add_tokens(child.token_ids, True, by_token)
        if child.detokenizer.stopped:
            child.finish_reason = "stop"
            child.stop_reason = child.detokenizer.stop_reason
        elif out.finished:
            child.finish_reason = out.finish_reason
            if out.finish_reason == "error":
                child.stop_reason = out.error  # why it failed (structured outputs)
            elif out.finish_reason == "stop" and out.new_token_ids:
                last = out.new_token_ids[-1]
                child.stop_reason = last if last in child.params.stop_token_ids else None

    def _request_output(self, parent: _Parent) -> RequestOutput:
        stream = self.stream
        outputs = [
            CompletionOutput(
                index=c.index,
                # Streaming shows only final text (none a stop string may still cut).
                text=c.detokenizer.emitted_text if stream else c.detokenizer.text,
                # Streamed outputs share the growing token list (as they share logprobs):
                # a copy per step would make a long output quadratic. Read it before the
                # next step, as the server does.
                token_ids=c.token_ids if stream else list(c.token_ids),
                cumulative_logprob=c.cumulative_logprob,
                logprobs=c.logprobs,
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
                routed_experts=_routed_experts(c, stream),
            )
            for c in parent.children.values()
        ]
        return RequestOutput(
            request_id=parent.request_id,
            prompt=parent.prompt,
            prompt_token_ids=parent.prompt_token_ids,
            outputs=outputs,
            finished=parent.finished,
            prompt_logprobs=parent.prompt_logprobs,
            metrics=parent.metrics,
            num_cached_tokens=parent.metrics.num_cached_tokens,
            pooled=parent.pooled,
        )


def _routed_experts(child: _Child, stream: bool) -> np.ndarray | None:
    """A sample's routed experts, one array once it finishes; streamed, the rows so far
    before (a view, as token_ids: read it before the next step). None where the engine
    records none."""
    if child.finish_reason is not None:
        return child.routed_experts.final()
    return child.routed_experts.view() if stream else None


def _max_routed_rows(prompt_token_ids: list[int], params: SamplingParams) -> int | None:
    """Most routed-experts rows a sample gets: every token but the last is forwarded."""
    if params.max_tokens is None:
        return None  # the core's max_model_len bounds it
    return len(prompt_token_ids) + params.max_tokens - 1


def _ends_on_stop_token(out: EngineOutput, child: _Child) -> bool:
    if not out.new_token_ids:
        return False
    last = out.new_token_ids[-1]
    return last in child.params.stop_token_ids or last in child.params.eos_token_ids
