"""GET /metrics: vLLM's metric names under the prefix `minivllm:`, and again under vLLM's
own `vllm:` (what routers, dashboards and autoscalers read), with prometheus-client.

ServerMetrics is AsyncLLM's observer: it sees each step's outputs once, so the cost is
a few dict operations per request per step. Its registry is its own (no global state).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from minivllm.engine.stats import EngineStats
from minivllm.engine.types import EngineOutput
from minivllm.outputs import RequestOutput

_LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
    0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_TOKEN_COUNT_BUCKETS = tuple(m * 10**e for e in range(7) for m in (1, 2, 5))  # 1 .. 5M
_OWN_PREFIX, _VLLM_PREFIX = "minivllm:", "vllm:"
# Older vLLM names of the same series, still read by some dashboards and routers.
_VLLM_OLD_NAMES = {
    "kv_cache_usage_perc": "gpu_cache_usage_perc",  # renamed in vLLM 0.10
    "inter_token_latency_seconds": "time_per_output_token_seconds",  # renamed in vLLM 0.11
}


@dataclass
class _Progress:
    num_tokens: int
    first_token_time: float
    last_token_time: float


class _VLLMNames:
    """A collector that yields every `minivllm:` family again as `vllm:NAME` (and under
    _VLLM_OLD_NAMES): the copies are made per scrape, so a step updates one set of metrics."""

    def __init__(self, families: list[Counter | Gauge | Histogram]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        for own in self._families:
            for family in own.collect():
                short = family.name.removeprefix(_OWN_PREFIX)
                for name in (short, _VLLM_OLD_NAMES.get(short)):
                    if name is not None:
                        yield _renamed(family, short, name)


def _renamed(family: Metric, short: str, name: str) -> Metric:
    copy = Metric(_VLLM_PREFIX + name, family.documentation, family.type, family.unit)
    old_prefix = _OWN_PREFIX + short
    copy.samples = [
        s._replace(name=_VLLM_PREFIX + name + s.name.removeprefix(old_prefix))
        for s in family.samples
    ]
    return copy


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}
        self._labels = labels
        r = self.registry
        names = ["model_name"]
        families: list[Counter | Gauge | Histogram] = []

        def own(family):
            families.append(family)
            return family

        def gauge(name: str, doc: str) -> Gauge:
            return own(Gauge(_OWN_PREFIX + name, doc, names, registry=r)).labels(**labels)

        def counter(name: str, doc: str) -> Counter:
            return own(Counter(_OWN_PREFIX + name, doc, names, registry=r)).labels(**labels)

        def labelled_counter(name: str, doc: str, label: str) -> Counter:
            """A family with one more label than model_name (labels() per value)."""
            return own(Counter(_OWN_PREFIX + name, doc, [*names, label], registry=r))

        def histogram(name: str, doc: str, buckets) -> Histogram:
            family = Histogram(_OWN_PREFIX + name, doc, names, buckets=buckets, registry=r)
            return own(family).labels(**labels)

        self.running = gauge("num_requests_running", "Requests in the running batch")
        self.waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled")
        self.kv_usage = gauge("kv_cache_usage_perc", "KV cache usage (1 = full)")
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens found in the cache")
        self.preemptions = counter("num_preemptions", "Preemptions")
        self.prompt_tokens = counter("prompt_tokens", "Prefill tokens processed")
        self.generation_tokens = counter("generation_tokens", "Generation tokens processed")
        self.spec_drafts = counter("spec_decode_num_drafts", "Speculative drafting steps")
        self.spec_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens proposed")
        self.spec_accepted = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted")
        self._spec_per_pos = labelled_counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by draft position",
            "position",
        )
        self._success = labelled_counter(
            "request_success", "Finished requests, by finish reason", "finished_reason"
        )
        self.ttft = histogram(
            "time_to_first_token_seconds", "Time to first token", _LATENCY_BUCKETS
        )
        self.itl = histogram("inter_token_latency_seconds", "Inter-token latency", _ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "End-to-end latency", _LATENCY_BUCKETS)
        self.queue_time = histogram(
            "request_queue_time_seconds", "Time waiting before the first step", _LATENCY_BUCKETS
        )
        self.prefill_time = histogram(
            "request_prefill_time_seconds", "First step to first token", _LATENCY_BUCKETS
        )
        self.decode_time = histogram(
            "request_decode_time_seconds", "First token to the last", _LATENCY_BUCKETS
        )
        self.inference_time = histogram(
            "request_inference_time_seconds", "First step to the last token", _LATENCY_BUCKETS
        )
        self.request_prompt_tokens = histogram(
            "request_prompt_tokens", "Prompt tokens per request", _TOKEN_COUNT_BUCKETS
        )
        self.request_generation_tokens = histogram(
            "request_generation_tokens", "Generated tokens per request", _TOKEN_COUNT_BUCKETS
        )
        r.register(_VLLMNames(families))
        self._last = EngineStats()
        self._progress: dict[str, _Progress] = {}

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def on_step(
        self, engine_outputs: list[EngineOutput], outputs: list[RequestOutput], stats: EngineStats
    ) -> None:
        """Called by AsyncLLM once per engine step."""
        now = time.time()
        self._observe_stats(stats)
        num_new = sum(len(o.new_token_ids) for o in engine_outputs)
        if num_new:
            self.generation_tokens.inc(num_new)
        for output in outputs:
            self._observe_request(output, now)

    def on_abort(self, request_id: str) -> None:
        """Called by AsyncLLM for an aborted request."""
        self._progress.pop(request_id, None)

    def _observe_stats(self, stats: EngineStats) -> None:
        last, self._last = self._last, stats
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_cache_usage)
        # The core's counters are totals; prometheus counters take increments.
        for counter, new, old in (
            (self.prefix_queries, stats.prefix_cache_queries, last.prefix_cache_queries),
            (self.prefix_hits, stats.prefix_cache_hits, last.prefix_cache_hits),
            (self.preemptions, stats.num_preemptions, last.num_preemptions),
            (self.spec_drafts, stats.spec_num_drafts, last.spec_num_drafts),
            (self.spec_draft_tokens, stats.spec_num_draft_tokens, last.spec_num_draft_tokens),
            (self.spec_accepted, stats.spec_num_accepted_tokens, last.spec_num_accepted_tokens),
        ):
            if new > old:
                counter.inc(new - old)
        old_per_pos = last.spec_accepted_per_pos or [0] * len(stats.spec_accepted_per_pos)
        for position, (new, old) in enumerate(zip(stats.spec_accepted_per_pos, old_per_pos)):
            if new > old:
                self._spec_per_pos.labels(position=str(position), **self._labels).inc(new - old)

    def _observe_request(self, output: RequestOutput, now: float) -> None:
        num_tokens = sum(len(c.token_ids) for c in output.outputs)
        progress = self._progress.get(output.request_id)
        metrics = output.metrics
        if progress is None and num_tokens:
            progress = self._progress[output.request_id] = _Progress(num_tokens, now, now)
            self.prompt_tokens.inc(len(output.prompt_token_ids))
            if metrics is not None:
                self.ttft.observe(now - metrics.arrival_time)
        elif progress is not None and num_tokens > progress.num_tokens:
            self.itl.observe(now - progress.last_token_time)
            progress.num_tokens, progress.last_token_time = num_tokens, now
        if output.finished:
            self._progress.pop(output.request_id, None)
            self._observe_finished(output, progress, num_tokens, now)

    def _observe_finished(
        self, output: RequestOutput, progress: _Progress | None, num_tokens: int, now: float
    ) -> None:
        metrics = output.metrics
        for choice in output.outputs:
            self._success.labels(
                finished_reason=choice.finish_reason or "abort", **self._labels
            ).inc()
        self.request_prompt_tokens.observe(len(output.prompt_token_ids))
        self.request_generation_tokens.observe(num_tokens)
        if metrics is None:
            return
        self.e2e.observe(now - metrics.arrival_time)
        scheduled = metrics.first_scheduled_time
        if scheduled is not None:
            self.queue_time.observe(max(scheduled - metrics.arrival_time, 0))
            self.inference_time.observe(max(now - scheduled, 0))
        if progress is not None:
            if scheduled is not None:
                self.prefill_time.observe(max(progress.first_token_time - scheduled, 0))
            self.decode_time.observe(now - progress.first_token_time)
